// server/http/drained_read.h: a read after which the kernel reports nothing left lets the
// socket's next read wait for epoll instead of trying a recv that finds nothing. The system calls
// are counted by this binary's own recv() and recvmsg(), which the reads call in place of libc's.
#include "server/http/drained_read.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <string>

namespace {

std::atomic<int> recv_calls{0};
std::atomic<int> recv_empty{0};  // calls that found nothing (EAGAIN)

void reset_counts() {
  recv_calls = 0;
  recv_empty = 0;
}

ssize_t counted(long n) {
  ++recv_calls;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ++recv_empty;
  return static_cast<ssize_t>(n);
}

}  // namespace

extern "C" ssize_t recv(int fd, void* buf, size_t len, int flags) {
  return counted(syscall(SYS_recvfrom, fd, buf, len, flags, nullptr, nullptr));
}
extern "C" ssize_t recvmsg(int fd, struct msghdr* msg, int flags) { return counted(syscall(SYS_recvmsg, fd, msg, flags)); }

namespace lmserve::server::http {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// A connected pair on loopback: `server` is read through Asio, `client` written to directly.
struct Pair {
  net::io_context io{1};
  // Keeps poll() running the reactor (epoll_wait) when no operation is under way, as a server's
  // loop does: an edge is then taken before the read that follows it.
  net::executor_work_guard<net::io_context::executor_type> busy{io.get_executor()};
  tcp::socket server{io};
  tcp::socket client{io};
  Pair() {
    tcp::acceptor acceptor(io, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
    enable_drained_reads(server);
  }
  void send(const std::string& s) { ASSERT_EQ(net::write(client, net::buffer(s)), s.size()); }
  // Runs the handlers ready now and those the data already sent brings (loopback delivers at
  // once), without blocking on what will never come.
  void settle() {
    for (int i = 0; i < 50; ++i) {
      io.restart();
      io.poll();
      usleep(1000);
    }
    io.restart();
    io.poll();
  }
};

// Reads with `drained` (or Asio's own read) into a buffer of `size` bytes; collects what came.
struct Reader {
  Pair& p;
  bool drained;
  std::size_t size = 64;
  std::string got;
  int completions = 0;
  boost::system::error_code ec;
  std::string buf = std::string(size, '\0');
  void read() {
    auto done = [this](boost::system::error_code e, std::size_t n) {
      ec = e;
      ++completions;
      got.append(buf.data(), n);
    };
    if (drained) async_read_some_drained(p.server, net::buffer(buf), done);
    else p.server.async_read_some(net::buffer(buf), done);
  }
  // Sends `s` and reads what arrived of it.
  void take(const std::string& s) {
    p.send(s);
    read();
    p.settle();
  }
};

TEST(DrainedRead, AfterAShortReadTheNextReadTriesNoRecvThatFindsNothing) {
  for (const bool drained : {false, true}) {
    Pair p;
    Reader r{p, drained};
    r.take("abc");
    ASSERT_EQ(r.got, "abc");
    reset_counts();
    r.read();  // nothing there: Asio's own read tries a recv first
    p.settle();
    EXPECT_EQ(r.completions, 1);
    EXPECT_EQ(recv_empty.load(), drained ? 0 : 1) << (drained ? "drained" : "asio's read");
    p.send("de");
    p.settle();
    EXPECT_EQ(r.completions, 2);
    EXPECT_EQ(r.got, "abcde");
    EXPECT_EQ(recv_empty.load(), drained ? 0 : 1);
  }
}

// Data that arrives between a short read and the next read is not lost: its arrival is an edge
// of its own, and the next read waits for that edge.
TEST(DrainedRead, DataArrivingBeforeTheNextReadStartsIsRead) {
  Pair p;
  Reader r{p, true};
  r.take("x");
  ASSERT_EQ(r.got, "x");
  p.send("y");
  p.settle();  // no read under way: the edge comes and finds none
  r.read();
  p.settle();
  EXPECT_EQ(r.completions, 2);
  EXPECT_EQ(r.got, "xy");
}

// A read that leaves bytes behind (its buffer was full) keeps the next read speculative: it tries
// a recv at once and finds the rest without waiting for epoll.
TEST(DrainedRead, BytesLeftKeepTheNextReadSpeculative) {
  Pair p;
  Reader r{p, true};
  r.take(std::string(100, 'z'));
  ASSERT_EQ(r.got.size(), 64u);
  reset_counts();
  r.read();  // completes inside the call, before any poll
  EXPECT_EQ(recv_calls.load(), 1);
  EXPECT_EQ(recv_empty.load(), 0);
  p.settle();
  EXPECT_EQ(r.got.size(), 100u);
}

TEST(DrainedRead, TheEndOfTheStreamAfterAShortReadIsReported) {
  Pair p;
  Reader r{p, true};
  r.take("last");
  ASSERT_EQ(r.got, "last");
  r.read();
  p.settle();
  EXPECT_EQ(r.completions, 1);
  p.client.shutdown(tcp::socket::shutdown_send);
  p.settle();
  EXPECT_EQ(r.completions, 2);
  EXPECT_EQ(r.ec, net::error::eof);
}

// The peer's last bytes and its FIN taken by one read: the kernel reports the FIN as something
// left, so the next read tries a recv and finds the end instead of waiting for an edge that
// already came.
TEST(DrainedRead, TheEndThatCameWithTheLastBytesIsFound) {
  Pair p;
  Reader r{p, true};
  p.send("bye");
  p.client.shutdown(tcp::socket::shutdown_send);
  usleep(20000);
  p.settle();  // both there, and their edges taken by epoll, before the read
  r.read();
  p.settle();
  ASSERT_EQ(r.got, "bye");
  r.read();
  p.settle();
  EXPECT_EQ(r.completions, 2);
  EXPECT_EQ(r.ec, net::error::eof);
}

}  // namespace
}  // namespace lmserve::server::http

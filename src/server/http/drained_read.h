// A socket read that knows, from the kernel, when it has drained the socket (nginx knows it from
// epoll's EPOLLRDHUP and a short count).
//
// Asio's reactor reads a socket speculatively when an operation starts: the `recv` runs at once,
// and only when it finds nothing (EAGAIN) does the operation wait in epoll. In a proxy that is
// the wrong guess twice a request: the read of a replica's answer starts right after the request
// went out, and the client's next request (or its disconnect) is watched for right after the
// last one was parsed; both find nothing. Boost 1.81's reactor skips the speculative `recv` when
// the descriptor's last read reported "done and exhausted", which its own reads report only at
// the end of the stream.
//
// The kernel says when a socket is drained: with TCP_INQ set on it, every recvmsg reports how many
// bytes are left to read, and 1 when nothing is left but the peer's FIN has come (so that a read
// that took the last bytes and the FIN together is not mistaken for a drained socket: the next
// read must find the end). async_read_some_drained(stream, buffer, handler) is
// stream.async_read_some(buffer, handler) whose read, on a socket with enable_drained_reads(),
// reports "exhausted" when the kernel said nothing is left. The next read of that socket then
// waits for epoll's next edge (Asio registers sockets with EPOLLET: an edge comes for every
// arrival after the read) instead of trying a `recv` first. On a socket without TCP_INQ, and on
// other streams (TLS, test streams), it is an ordinary async_read_some.
//
// Contract: at most one read at a time on the socket (the reactor stops at an exhausted read and
// leaves later queued reads for the next edge), which both users keep anyway.
#pragma once

#include <boost/asio/basic_stream_socket.hpp>  // the reactor and its socket read, below
#include <boost/asio/buffer.hpp>
#include <boost/asio/detail/reactive_socket_recv_op.hpp>
#include <boost/version.hpp>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <utility>

static_assert(BOOST_VERSION / 100 == 1081,
              "drained_read.h specialises Boost 1.81's reactive socket read; check it against this Boost's reactor");

namespace lmserve::server::http {

// One buffer, as a buffer sequence of its own type (so that its read is the one below).
struct DrainedReadBuffer {
  boost::asio::mutable_buffer buffer;
  const boost::asio::mutable_buffer* begin() const { return &buffer; }
  const boost::asio::mutable_buffer* end() const { return &buffer + 1; }
};

// Asks the kernel to report what is left after each read of this TCP socket (TCP_INQ, Linux 4.18).
// Where it cannot, the socket's reads stay Asio's own. Once per socket, where it is opened.
template <class Socket>
void enable_drained_reads(Socket& socket) {
  const int on = 1;
  (void)::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_INQ, &on, sizeof on);
}

template <class Stream, class Handler>
auto async_read_some_drained(Stream& stream, boost::asio::mutable_buffer buffer, Handler&& handler) {
  return stream.async_read_some(DrainedReadBuffer{buffer}, std::forward<Handler>(handler));
}

}  // namespace lmserve::server::http

namespace boost::asio::detail {

// The reactor's read of a DrainedReadBuffer: Asio's own read of one buffer (socket_ops::
// non_blocking_recv1: EOF on a stream, a retry on EINTR, not done on EAGAIN), through recvmsg so
// that the kernel's count of what is left comes back; none left is reported as exhausted.
template <>
inline reactor_op::status reactive_socket_recv_op_base<lmserve::server::http::DrainedReadBuffer>::do_perform(reactor_op* base) {
  auto* o = static_cast<reactive_socket_recv_op_base*>(base);
  const mutable_buffer& b = o->buffers_.buffer;
  const bool stream = (o->state_ & socket_ops::stream_oriented) != 0;
  for (;;) {
    iovec iov{b.data(), b.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(o->socket_, &msg, o->flags_);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return not_done;
      o->ec_ = boost::system::error_code(err, boost::asio::error::get_system_category());
      o->bytes_transferred_ = 0;
      return done;
    }
    o->ec_ = boost::system::error_code();
    if (stream && n == 0) {
      o->ec_ = boost::asio::error::eof;
      o->bytes_transferred_ = 0;
      return done_and_exhausted;  // as Asio's own read
    }
    o->bytes_transferred_ = static_cast<std::size_t>(n);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_TCP && c->cmsg_type == TCP_CM_INQ) {
        int left = 0;
        std::memcpy(&left, CMSG_DATA(c), sizeof left);
        return left == 0 ? done_and_exhausted : done;
      }
    }
    return done;  // no count: TCP_INQ is off, or not a TCP socket
  }
}

}  // namespace boost::asio::detail

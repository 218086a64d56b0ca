// server/http's Asio side, for applications that do I/O of their own on the transport's threads
// (the gateway's connections to replicas, its health checks and timers). Kept out of transport.h
// so that applications which only answer requests never see Asio.
//
// Each I/O thread runs an io_context of its own, and a connection lives on one of them. Everything
// an exchange's application does with its own sockets and timers should be created on
// io_context_of(exchange): their handlers then run on the exchange's own thread, one at a time
// with its other handlers, so they may call the Exchange directly, with no hop between threads
// and no strand.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>

#include "server/http/transport.h"

namespace lmserve::server::http {

struct AsioAccess {
  // The executor of the exchange's connection (its I/O thread's io_context).
  static boost::asio::any_io_executor executor_of(const Exchange& exchange);
  static boost::asio::io_context& io_context_of(const Exchange& exchange);
  // The io_context of the transport's first I/O thread (the one run() runs on), for what the
  // application does outside any exchange (valid from construction; run by run()).
  static boost::asio::io_context& context_of(Transport& transport);
};

inline boost::asio::any_io_executor executor_of(const Exchange& exchange) { return AsioAccess::executor_of(exchange); }
inline boost::asio::io_context& io_context_of(const Exchange& exchange) { return AsioAccess::io_context_of(exchange); }
inline boost::asio::io_context& context_of(Transport& transport) { return AsioAccess::context_of(transport); }

}  // namespace lmserve::server::http

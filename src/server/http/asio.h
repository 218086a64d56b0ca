// server/http's Asio side, for applications that do I/O of their own on the transport's threads
// (the gateway's connections to replicas, its health checks and timers). Kept out of transport.h
// so that applications which only answer requests never see Asio.
//
// Everything an exchange's application does with its own sockets and timers should run on
// executor_of(exchange): handlers there run one at a time with the exchange's own, so they may call
// the Exchange directly, with no hop between threads.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>

#include "server/http/transport.h"

namespace lmserve::server::http {

struct AsioAccess {
  // The strand of the exchange's connection.
  static boost::asio::any_io_executor executor_of(const Exchange& exchange);
  // The io_context the transport's io_threads run (valid from construction; run by run()).
  static boost::asio::io_context& context_of(Transport& transport);
};

inline boost::asio::any_io_executor executor_of(const Exchange& exchange) { return AsioAccess::executor_of(exchange); }
inline boost::asio::io_context& context_of(Transport& transport) { return AsioAccess::context_of(transport); }

}  // namespace lmserve::server::http

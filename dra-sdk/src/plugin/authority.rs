//! HTTP/2 `:authority` rewriting for the registration socket.

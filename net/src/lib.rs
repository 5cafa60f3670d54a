//! ninefold's network side: the 9P2000.L wire codec and the server that maps 9P requests
//! onto the filesystem interface ([`vfs::FileSystem`]).
//!
//! `no_std + alloc`, with no hardware in it: the appliance feeds it bytes from smoltcp
//! sockets, the host tool from std TCP streams, tests from memory.
//!
//! - [`wire`]: message types, encoding and decoding (no server logic).
//! - [`server`]: sessions, fids, exports, permissions, locks; requests onto the fs.
//! - [`conn`]: the transport-agnostic connection driver (bytes in, replies out).
//! - [`memory`]: the budget of what clients can make the server allocate.
//! - [`service`]: the serving policy (admission, placement on workers, a connection's
//!   life and close, deadlines, shutdown, counters) over any transport.
//!
//! To serve: wrap a mounted filesystem in a [`server::Server`] (in an `Arc`: connections
//! on several CPUs share it, see [`server`]'s "Concurrency"), make a
//! [`conn::Connection`] per accepted stream on the CPU that will run it, and either
//! `run` it over a [`conn::Transport`] or feed it bytes and poll it yourself.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod admin;
pub mod conn;
pub mod memory;
pub mod server;
pub mod service;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wire;

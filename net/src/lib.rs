//! ninefold's network side: the 9P2000.L wire codec and the server that maps 9P requests
//! onto the filesystem interface ([`fs::vfs::FileSystem`]).
//!
//! `no_std + alloc`, with no hardware in it: the appliance feeds it bytes from smoltcp
//! sockets, the host tool from std TCP streams, tests from memory.
//!
//! - [`wire`]: message types, encoding and decoding (no server logic).
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod wire;

//! The 9P service's limits and how they are sized from memory (pure; host-tested). Which
//! CPU serves a new connection is the serving policy's (`ninep::service::placement`).

/// Default most concurrent client connections (`max_conns=`). Past it a new client takes
/// the slot of the quietest connection without fids, or is refused (reset).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Listening sockets kept ready, so that several clients connecting at once are all
/// accepted (smoltcp needs one listening socket per connection being accepted).
pub const LISTEN_POOL: usize = 4;
/// How long the pool keeps the extra listening sockets of a burst (clients the SYN gate
/// held back, `super::syn_gate`) after the last request held back: longer than Linux's
/// SYN retransmissions up to the fourth (1 + 2 + 4 + 8 s).
pub const BURST_HOLD: core::time::Duration = core::time::Duration::from_secs(20);
/// Connection requests the SYN gate keeps while no socket listens for them, to let them
/// in once the pool is refilled (`super::syn_gate`): as many as the default connection
/// limit, so a burst of that many clients waits for the listener, not for their own
/// retransmissions.
pub const SYN_BACKLOG: usize = DEFAULT_MAX_CONNECTIONS;
/// Smallest and largest per-direction socket buffer.
pub const MIN_SOCKET_BUFFER: usize = 64 << 10;
/// See [`MIN_SOCKET_BUFFER`]. A 1 MiB window covers a whole 1 MiB-msize message.
pub const MAX_SOCKET_BUFFER: usize = 1 << 20;
/// Share of the heap the 9P server may spend on its clients' behalf (frames, replies,
/// fids, xattr values, locks: `ninep::memory`) unless `client_mem=` says otherwise. The
/// rest: the node cache (a fifth, twice that while a checkpoint writes), socket buffers
/// (at most a quarter), the filesystem's and the kernel's own work.
pub const CLIENT_MEMORY_SHARE: u64 = 6;
/// Smallest client memory budget: one connection with the largest msize must fit.
pub const MIN_CLIENT_MEMORY: u64 = 4 << 20;

/// The receive (and transmit) buffer size of each TCP socket, so that `sockets` sockets
/// with both buffers full take at most a quarter of a `heap_bytes` heap: a power of two in
/// [`MIN_SOCKET_BUFFER`]..=[`MAX_SOCKET_BUFFER`]. Buffers beyond 64 KiB make smoltcp
/// offer TCP window scaling.
pub fn socket_buffer(heap_bytes: u64, sockets: usize) -> usize {
    let budget = heap_bytes / 4 / (2 * sockets.max(1) as u64);
    let pow2 = match budget {
        0 => 0,
        b => 1u64 << (63 - b.leading_zeros()),
    };
    (pow2 as usize).clamp(MIN_SOCKET_BUFFER, MAX_SOCKET_BUFFER)
}

/// Sockets the service can hold at once with `connections` allowed: every connection,
/// the listening pool, and as many again as the pool for connections being closed to
/// make room (a reclaimed slot is given away before its teardown ends).
pub const fn max_sockets(connections: usize) -> usize {
    connections + 2 * LISTEN_POOL
}

/// The 9P server's memory budget for a `heap_bytes` heap.
pub fn client_memory(heap_bytes: u64) -> usize {
    (heap_bytes / CLIENT_MEMORY_SHARE).max(MIN_CLIENT_MEMORY) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn buffers_scale_with_memory_within_bounds() {
        let sockets = max_sockets(DEFAULT_MAX_CONNECTIONS);
        // 128 MiB of RAM gives a 94 MiB heap: 128 KiB per direction for 72 sockets,
        // 18 MiB in all at worst.
        let small = socket_buffer(94 * MIB, sockets);
        assert_eq!(small, 128 << 10);
        assert!((small * 2 * sockets) as u64 <= 94 * MIB / 4);
        // 512 MiB (make run) gives about 375 MiB of heap.
        assert_eq!(socket_buffer(375 * MIB, sockets), 512 << 10);
        // Bounds.
        assert_eq!(socket_buffer(8 * 1024 * MIB, sockets), MAX_SOCKET_BUFFER);
        assert_eq!(socket_buffer(MIB, sockets), MIN_SOCKET_BUFFER);
        assert_eq!(socket_buffer(0, 0), MIN_SOCKET_BUFFER);
    }

    #[test]
    fn buffers_are_powers_of_two() {
        for heap in [10 * MIB, 94 * MIB, 200 * MIB, 750 * MIB, 3000 * MIB] {
            for sockets in [1, 5, 68, 1000] {
                assert!(socket_buffer(heap, sockets).is_power_of_two());
            }
        }
    }

    #[test]
    fn client_memory_is_a_share_of_the_heap_with_a_floor() {
        // 128 MiB of RAM: about 15 MiB for clients; 512 MiB: about 62 MiB.
        assert_eq!(client_memory(94 * MIB), (94 * MIB / 6) as usize);
        assert_eq!(client_memory(375 * MIB), (375 * MIB / 6) as usize);
        assert_eq!(client_memory(8 * MIB), MIN_CLIENT_MEMORY as usize);
        // What the heap holds at worst stays below it: node cache (2/5 at peak), socket
        // buffers (1/4), clients (1/6).
        let heap = 94 * MIB;
        let sockets = (socket_buffer(heap, max_sockets(64)) * 2 * max_sockets(64)) as u64;
        let worst = heap * 2 / 5 + sockets + client_memory(heap) as u64;
        assert!(worst < heap * 17 / 20, "{worst} of {heap}");
    }
}

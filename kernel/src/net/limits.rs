//! The 9P service's limits and socket buffer sizing (pure; host-tested).

/// Concurrent client connections served; more are refused (reset) until one closes.
pub const MAX_CONNECTIONS: usize = 64;
/// Listening sockets kept ready, so that several clients connecting at once are all
/// accepted (smoltcp needs one listening socket per connection being accepted).
pub const LISTEN_POOL: usize = 4;
/// Smallest and largest per-direction socket buffer.
pub const MIN_SOCKET_BUFFER: usize = 64 << 10;
/// See [`MIN_SOCKET_BUFFER`]. A 1 MiB window covers a whole 1 MiB-msize message.
pub const MAX_SOCKET_BUFFER: usize = 1 << 20;

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

/// Sockets the service can hold at once: every connection plus the listening pool.
pub const fn max_sockets() -> usize {
    MAX_CONNECTIONS + LISTEN_POOL
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn buffers_scale_with_memory_within_bounds() {
        // 128 MiB of RAM gives a 94 MiB heap: 128 KiB per direction for 68 sockets,
        // 17 MiB in all at worst.
        let small = socket_buffer(94 * MIB, max_sockets());
        assert_eq!(small, 128 << 10);
        assert!((small * 2 * max_sockets()) as u64 <= 94 * MIB / 4);
        // 512 MiB (make run) gives about 375 MiB of heap.
        assert_eq!(socket_buffer(375 * MIB, max_sockets()), 512 << 10);
        // Bounds.
        assert_eq!(
            socket_buffer(8 * 1024 * MIB, max_sockets()),
            MAX_SOCKET_BUFFER
        );
        assert_eq!(socket_buffer(MIB, max_sockets()), MIN_SOCKET_BUFFER);
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
}

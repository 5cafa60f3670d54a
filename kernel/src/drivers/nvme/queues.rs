//! How many I/O queue pairs a controller gets, and which MSI-X entry each one uses. Pure
//! and host-tested; the driver (`disk`) applies it.
//!
//! - The driver asks for `Options::io_queues` pairs (the appliance asks for one per CPU
//!   online), capped at [`MAX_IO_QUEUES`], with Set Features / Number of Queues;
//!   the controller answers how many submission and completion queues it allocated, which
//!   may be fewer (or more) than asked. The driver creates
//!   [`queue_count`]`(requested, granted)` pairs, identifiers `1..=n`.
//! - In interrupt mode MSI-X entry 0 is the admin queue's and I/O queue `qid` gets entry
//!   `qid` while the table and the interrupt vectors last; past that the I/O queues share
//!   the entries they have, round-robin ([`msix_entry`]): a shared entry wakes the
//!   reapers of every queue on it, so sharing costs a reaper pass that may find nothing,
//!   and the per-queue interrupt counters then count the shared interrupts.
//! - I/O queue `qid` belongs to CPU [`cpu_of`]`(qid, cpus)`: its MSI-X entry targets that
//!   CPU and its reaper runs there. With one pair per CPU, pair `i + 1` is CPU `i`'s,
//!   which is also the pair CPU `i`'s requests use.

/// The most I/O queue pairs a controller is given (QEMU's controller offers 64 by
/// default; the appliance will have no more CPUs than that).
pub const MAX_IO_QUEUES: u16 = 64;

/// The queue counts a Set Features / Number of Queues completion (dword 0) grants:
/// submission queues and completion queues, each 1-based (the field is 0-based).
pub fn granted(result: u32) -> (u32, u32) {
    ((result & 0xffff) + 1, (result >> 16) + 1)
}

/// How many I/O queue pairs to ask for: `requested`, at least 1, at most
/// [`MAX_IO_QUEUES`].
pub fn requested(requested: u16) -> u16 {
    requested.clamp(1, MAX_IO_QUEUES)
}

/// How many I/O queue pairs to create: as many as asked for (see [`requested`]), no more
/// than the controller granted of either kind.
pub fn queue_count(requested: u16, granted: (u32, u32)) -> u16 {
    let granted = granted.0.min(granted.1).min(u32::from(MAX_IO_QUEUES)) as u16;
    requested.min(granted)
}

/// The MSI-X entry of I/O queue `qid` (1-based) when entries `1..=io_entries` are routed
/// to I/O queues (entry 0 is the admin queue's): its own entry while there are enough,
/// otherwise the entries are shared round-robin.
///
/// # Panics
/// If `qid` or `io_entries` is 0.
pub fn msix_entry(qid: u16, io_entries: u16) -> u16 {
    assert!(
        qid > 0 && io_entries > 0,
        "I/O queues start at 1 and need an entry"
    );
    1 + (qid - 1) % io_entries
}

/// The CPU (index, of `cpus` online) that I/O queue `qid` (1-based) belongs to: the
/// queues go round the CPUs in order, so the queue CPU `c` submits to
/// (`c % queues`) is its own whenever there are at least as many queues as CPUs.
///
/// # Panics
/// If `qid` or `cpus` is 0.
pub fn cpu_of(qid: u16, cpus: usize) -> usize {
    assert!(qid > 0 && cpus > 0, "I/O queues start at 1, CPUs at one");
    usize::from(qid - 1) % cpus
}

/// How many MSI-X entries to route for `queues` I/O queues on a table of `table_len`
/// entries (one each while the table lasts; entry 0 is the admin queue's). 0 if the
/// table has no entry besides the admin one.
pub fn io_entries(queues: u16, table_len: u16) -> u16 {
    queues.min(table_len.saturating_sub(1))
}

/// Whether the shadow doorbell page (one 4 KiB page, laid out as the doorbell registers
/// with `stride` bytes between them) holds the doorbells of queues `0..=last_qid`.
pub fn shadow_page_covers(last_qid: u16, stride: usize, page: usize) -> bool {
    // The completion doorbell of the last queue is the last entry.
    (2 * usize::from(last_qid) + 1) * stride + 4 <= page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granted_counts_are_one_based() {
        // QEMU's default: 64 of each (0-based 63).
        assert_eq!(granted(0x003f_003f), (64, 64));
        assert_eq!(granted(0x0001_0003), (4, 2));
        assert_eq!(granted(0), (1, 1));
        assert_eq!(granted(0xffff_ffff), (65536, 65536));
    }

    #[test]
    fn queue_count_takes_the_smallest() {
        assert_eq!(requested(0), 1);
        assert_eq!(requested(3), 3);
        assert_eq!(requested(1000), MAX_IO_QUEUES);
        assert_eq!(queue_count(3, (64, 64)), 3);
        assert_eq!(queue_count(8, (4, 2)), 2);
        assert_eq!(queue_count(8, (2, 4)), 2);
        assert_eq!(queue_count(64, (65536, 65536)), 64);
        assert_eq!(queue_count(1, (1, 1)), 1);
    }

    #[test]
    fn msix_entries_are_own_then_shared() {
        // Enough entries: queue n on entry n.
        assert_eq!([1, 2, 3, 4].map(|q| msix_entry(q, 4)), [1, 2, 3, 4]);
        // Two I/O entries for five queues: 1, 2, 1, 2, 1.
        assert_eq!([1, 2, 3, 4, 5].map(|q| msix_entry(q, 2)), [1, 2, 1, 2, 1]);
        assert_eq!(msix_entry(64, 1), 1);
        assert_eq!(io_entries(3, 65), 3);
        assert_eq!(io_entries(64, 65), 64);
        assert_eq!(io_entries(64, 9), 8);
        assert_eq!(io_entries(4, 1), 0);
    }

    #[test]
    fn queues_go_round_the_cpus() {
        // One per CPU: the pair a CPU submits to (cpu % 4, 0-based) is its own.
        assert_eq!([1, 2, 3, 4].map(|q| cpu_of(q, 4)), [0, 1, 2, 3]);
        for cpu in 0..4 {
            assert_eq!(cpu_of((cpu % 4) as u16 + 1, 4), cpu);
        }
        // Fewer pairs than CPUs: CPUs 2 and 3 use pairs 1 and 2, which CPUs 0 and 1 own.
        assert_eq!([1, 2].map(|q| cpu_of(q, 4)), [0, 1]);
        // More pairs than CPUs, and one CPU.
        assert_eq!([1, 2, 3, 4, 5].map(|q| cpu_of(q, 2)), [0, 1, 0, 1, 0]);
        assert_eq!(cpu_of(64, 1), 0);
    }

    #[test]
    fn shadow_page_limits() {
        // 4-byte stride: queues 0..=511 fit one page.
        assert!(shadow_page_covers(64, 4, 4096));
        assert!(shadow_page_covers(511, 4, 4096));
        assert!(!shadow_page_covers(512, 4, 4096));
        // A wide stride covers fewer.
        assert!(shadow_page_covers(1, 16, 4096));
        assert!(!shadow_page_covers(128, 16, 4096));
    }
}

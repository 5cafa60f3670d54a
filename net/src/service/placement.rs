//! Which worker serves a new connection (pure; host-tested).
//!
//! A connection is handed whole to one worker for its life, so placement is decided once,
//! at accept: the worker serving fewest connections. A worker that also carries every
//! connection's network work (the appliance's CPU 0 runs the TCP/IP stack) counts each of
//! its own connections [`STACK_WORKER_WEIGHT`] times.

/// How many connections each connection of the stack's worker counts for. Measured under
/// bench-load at two vCPUs (docs/benchmarks.md, "Every vCPU serves"): the stack costs
/// about a third as much CPU per request as serving the request, so CPU 0 and CPU 1 are
/// about equally busy when CPU 0 serves about a third of the connections; counting each
/// of its twice comes close to that and, with more CPUs, leaves CPU 0 few connections.
pub const STACK_WORKER_WEIGHT: u64 = 2;

/// The worker to serve a new connection: of the `candidates` (worker index, connections
/// it serves now), the one serving fewest, those of `stack_worker` (the worker that also
/// runs the network stack, if any) counting [`STACK_WORKER_WEIGHT`] each. Ties go to a
/// worker other than the stack's, then to the lowest index. `None` without candidates.
pub fn least_loaded(
    candidates: impl IntoIterator<Item = (usize, u64)>,
    stack_worker: Option<usize>,
) -> Option<usize> {
    candidates
        .into_iter()
        .min_by_key(|&(worker, active)| {
            let stack = stack_worker == Some(worker);
            let load = match stack {
                true => active.saturating_mul(STACK_WORKER_WEIGHT),
                false => active,
            };
            (load, stack, worker)
        })
        .map(|(worker, _)| worker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    const STACK: Option<usize> = Some(0);

    #[test]
    fn a_connection_goes_to_the_worker_serving_fewest() {
        assert_eq!(least_loaded([], STACK), None);
        assert_eq!(least_loaded([(0, 5)], STACK), Some(0));
        // Equal counts: not the stack's worker, then the lowest index.
        assert_eq!(least_loaded([(0, 2), (1, 2), (2, 2)], STACK), Some(1));
        assert_eq!(least_loaded([(0, 1), (1, 3), (2, 3)], STACK), Some(0));
        assert_eq!(
            least_loaded([(0, 1), (1, 2), (2, 2)], STACK),
            Some(1),
            "the stack worker's count double"
        );
        assert_eq!(least_loaded([(0, 3), (1, 2), (3, 1)], STACK), Some(3));
        // Handed out one at a time, the others get twice as many as the stack's worker.
        let spread = |workers: usize, conns: usize, stack| {
            let mut load = vec![0u64; workers];
            for _ in 0..conns {
                let w = least_loaded(load.iter().copied().enumerate(), stack).unwrap();
                load[w] += 1;
            }
            load
        };
        assert_eq!(spread(2, 16, STACK), [5, 11]);
        assert_eq!(spread(4, 16, STACK), [2, 5, 5, 4]);
        assert_eq!(spread(4, 64, STACK), [9, 19, 18, 18]);
        // Without a stack worker (`ninefold serve`: the OS runs TCP): an even spread.
        assert_eq!(spread(4, 16, None), [4, 4, 4, 4]);
        assert_eq!(spread(3, 7, None), [3, 2, 2]);
    }
}

//! Virtqueue rules the virtio drivers share (pure, host-tested).

/// Whether the device must be notified of new available buffers (virtio 1.1, 2.6.7.2,
/// `VIRTIO_F_EVENT_IDX`): it asked to hear once the available index passes `event`, and
/// the indices published since the previous check are `old..new` (wrapping).
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn the_specifications_test() {
        // Published 5 -> 6, the device asked about index 5: notify.
        assert!(need_event(5, 6, 5));
        // The index passed 5 before the previous check: the device knows already.
        assert!(!need_event(5, 7, 6));
        // Several published at once across the event: notify.
        assert!(need_event(10, 14, 9));
        // Nothing published since the previous check: never.
        assert!(!need_event(5, 6, 6));
        // Wrapping: 65534 -> 1 passes 65535 and 0.
        assert!(need_event(65535, 1, 65534));
        assert!(need_event(0, 1, 65534));
        assert!(!need_event(65530, 1, 65534));
    }
}

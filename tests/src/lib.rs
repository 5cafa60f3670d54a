//! QEMU harness (placeholder).

//! Physical Region Page (PRP) entries: how an NVMe command points at its data.
//!
//! PRP1 holds the first data address (any dword-aligned offset into a page). If the data
//! spills into exactly one more page, PRP2 is that page; if into more, PRP2 points at a
//! *PRP list*: page-aligned entries, one per further page. A list page holds
//! `page_size / 8` entries; when more are needed, its last entry points at the next list
//! page instead. Every page after the first starts at offset 0, which a virtually (hence,
//! with the kernel's identity mapping, physically) contiguous buffer satisfies.

/// Bytes per PRP entry.
const ENTRY: usize = 8;

/// Why a buffer cannot be described by PRPs as it is (bounce it instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrpError {
    /// The data does not start on a dword boundary.
    Unaligned,
    /// Zero-length transfer.
    Empty,
}

/// What goes into PRP2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Second {
    /// The data fits in the first page.
    None,
    /// The data ends in the second page, at this address.
    Page(u64),
    /// PRP2 points at a list of `entries` entries spread over `list_pages` list pages.
    List {
        /// Data pages after the first.
        entries: usize,
        /// List pages needed to hold them (with chaining).
        list_pages: usize,
    },
}

/// The data pointer of one transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2's meaning.
    pub second: Second,
}

/// Pages after the first that `addr..addr + len` touches.
fn extra_pages(addr: u64, len: usize, page: usize) -> usize {
    let offset = (addr % page as u64) as usize;
    (offset + len).div_ceil(page) - 1
}

/// Address of the `k`-th page after the first (k >= 1).
fn page_addr(addr: u64, page: usize, k: usize) -> u64 {
    (addr & !(page as u64 - 1)) + (k * page) as u64
}

/// List pages needed for `entries` entries (with chaining; at least 1).
pub fn list_pages_for(entries: usize, page: usize) -> usize {
    let per_page = page / ENTRY;
    entries.saturating_sub(1).div_ceil(per_page - 1).max(1)
}

/// Describes `addr..addr + len` with PRPs, for a controller with `page`-byte pages.
pub fn plan(addr: u64, len: usize, page: usize) -> Result<Plan, PrpError> {
    debug_assert!(page.is_power_of_two() && page >= 4096);
    if len == 0 {
        return Err(PrpError::Empty);
    }
    if !addr.is_multiple_of(4) {
        return Err(PrpError::Unaligned);
    }
    let second = match extra_pages(addr, len, page) {
        0 => Second::None,
        1 => Second::Page(page_addr(addr, page, 1)),
        entries => Second::List {
            entries,
            list_pages: list_pages_for(entries, page),
        },
    };
    Ok(Plan { prp1: addr, second })
}

/// Writes the PRP list for `addr..addr + len` into list pages at `lists` (physical
/// addresses, at least `list_pages` of them): `write(list_page, entry, value)` stores one
/// entry. PRP2 is `lists[0]`.
pub fn fill_list(
    addr: u64,
    len: usize,
    page: usize,
    lists: &[u64],
    mut write: impl FnMut(usize, usize, u64),
) {
    let per_page = page / ENTRY;
    let entries = extra_pages(addr, len, page);
    assert!(
        lists.len() >= list_pages_for(entries, page),
        "{} list pages for {entries} entries",
        lists.len()
    );
    let (mut list, mut slot) = (0, 0);
    for k in 1..=entries {
        let remaining = entries - k + 1;
        if slot == per_page - 1 && remaining > 1 {
            write(list, slot, lists[list + 1]);
            list += 1;
            slot = 0;
        }
        write(list, slot, page_addr(addr, page, k));
        slot += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use alloc::vec::Vec;

    const PAGE: usize = 4096;

    /// Walks a command's PRPs the way a controller does and returns the byte ranges it
    /// would transfer, in order.
    fn device_walk(plan: &Plan, len: usize, memory: &BTreeMap<u64, u64>) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        let first = (PAGE - (plan.prp1 as usize % PAGE)).min(len);
        out.push((plan.prp1, first));
        let left = len - first;
        match plan.second {
            Second::None => assert_eq!(left, 0),
            Second::Page(p) => {
                assert!(p.is_multiple_of(PAGE as u64) && left <= PAGE);
                out.push((p, left));
            }
            Second::List { .. } => {
                let mut left = left;
                let mut entry_addr = LIST_BASE;
                let per_page = (PAGE / ENTRY) as u64;
                while left > 0 {
                    let index_in_page = (entry_addr % PAGE as u64) / ENTRY as u64;
                    let value = memory[&entry_addr];
                    if index_in_page == per_page - 1 && left > PAGE {
                        entry_addr = value; // chain to the next list page
                        continue;
                    }
                    assert!(value.is_multiple_of(PAGE as u64));
                    let n = left.min(PAGE);
                    out.push((value, n));
                    left -= n;
                    entry_addr += ENTRY as u64;
                }
            }
        }
        out
    }

    const LIST_BASE: u64 = 0x7700_0000;

    fn check(addr: u64, len: usize) -> Plan {
        let plan = plan(addr, len, PAGE).unwrap();
        let mut memory = BTreeMap::new();
        if let Second::List { list_pages, .. } = plan.second {
            // Deliberately non-contiguous list pages.
            let lists: Vec<u64> = (0..list_pages)
                .map(|i| LIST_BASE + (i as u64) * 3 * PAGE as u64)
                .collect();
            fill_list(addr, len, PAGE, &lists, |l, e, v| {
                assert!(e < PAGE / ENTRY);
                memory.insert(lists[l] + (e * ENTRY) as u64, v);
            });
        }
        let walked = device_walk(&plan, len, &memory);
        // The pieces are exactly the buffer, in order.
        let mut at = addr;
        for (a, n) in &walked {
            assert_eq!(*a, at, "{addr:#x}+{len:#x}: {walked:x?}");
            at += *n as u64;
        }
        assert_eq!(at, addr + len as u64);
        plan
    }

    #[test]
    fn small_transfers_need_no_list() {
        assert_eq!(check(0x10_0000, 512).second, Second::None);
        assert_eq!(check(0x10_0000, 4096).second, Second::None);
        assert_eq!(check(0x10_0e00, 512).second, Second::None);
        assert_eq!(check(0x10_0e00, 1024).second, Second::Page(0x10_1000));
        assert_eq!(check(0x10_0000, 8192).second, Second::Page(0x10_1000));
    }

    #[test]
    fn lists_cover_every_page() {
        for (addr, len) in [
            (0x20_0000, 3 * PAGE),
            (0x20_0004, 3 * PAGE),
            (0x20_0200, 128 * PAGE),
            (0x20_0000, 128 * PAGE),
            (0x20_0000, 513 * PAGE),
            (0x20_0000, 514 * PAGE),
            (0x20_0c00, 512 * PAGE),
            (0x20_0000, 1024 * PAGE),
            (0x20_0000, 1100 * PAGE + 512),
        ] {
            let plan = check(addr, len);
            assert!(matches!(plan.second, Second::List { .. }));
        }
    }

    #[test]
    fn list_page_counts() {
        assert_eq!(list_pages_for(2, PAGE), 1);
        assert_eq!(list_pages_for(512, PAGE), 1);
        assert_eq!(list_pages_for(513, PAGE), 2);
        assert_eq!(list_pages_for(1023, PAGE), 2);
        assert_eq!(list_pages_for(1024, PAGE), 3);
        let p = plan(0x20_0000, 513 * PAGE, PAGE).unwrap();
        assert_eq!(
            p.second,
            Second::List {
                entries: 512,
                list_pages: 1
            }
        );
    }

    #[test]
    fn unaligned_or_empty_buffers_are_refused() {
        assert_eq!(plan(0x1001, 512, PAGE), Err(PrpError::Unaligned));
        assert_eq!(plan(0x1002, 512, PAGE), Err(PrpError::Unaligned));
        assert_eq!(plan(0x1000, 0, PAGE), Err(PrpError::Empty));
    }
}

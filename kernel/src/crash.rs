//! Deliberate crashes (`crash=` on the command line), to prove the fault reports work.

use crate::config::Crash;
use crate::hal::trap;

/// An address in page 0, which is never mapped (null-pointer dereferences fault).
const UNMAPPED: u64 = 0x0000_0000_0000_0008;

/// Crashes the way `crash` says. Does not return.
pub fn trigger(crash: Crash) -> ! {
    log::warn!("crash: {crash:?} requested on the command line; crashing now");
    match crash {
        Crash::PageFault => trap::touch(UNMAPPED),
        Crash::StackOverflow => {
            let depth = recurse(0);
            panic!("recursion of depth {depth} returned: the stack has no guard page")
        }
        Crash::Panic => panic!("crash=panic requested on the command line"),
    }
}

/// Uses 4 KiB of stack per level, forever (until the guard page).
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let frame = core::hint::black_box([depth; 512]);
    recurse(depth + 1) + frame[511]
}

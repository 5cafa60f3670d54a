//! Housekeeping across connections: deadlines for connections that hold a slot without
//! using it, and reclaiming memory or a connection slot from the client that holds the
//! most without using it, so that one client cannot keep the others out.
//!
//! The server decides *whom* to close ([`Session::request_close`]); the connection driver
//! closes it; the transport's owner (the appliance's service, `ninefold serve`) calls
//! [`Server::sweep`] periodically and [`Server::reclaim_slot`] when a client connects at
//! the connection limit.
//!
//! Rules (all times on [`super::Config::clock`]; without a clock nothing expires):
//! - no successful `Tversion` within [`Timeouts::handshake_ns`] of connecting → closed;
//! - no fid, nothing outstanding and no request for [`Timeouts::idle_ns`] → closed (a
//!   connection with fids is a mount, however quiet: it stays);
//! - at the connection limit, a new client takes the slot of the connection without fids
//!   and without outstanding requests that has been quiet longest, if it has been quiet
//!   for [`Timeouts::slot_grace_ns`] (a mount between its connect and its attach is not
//!   quiet), if there is one;
//! - at the connection limit, a new client whose tenant holds less than its fair share
//!   of the slots (the limit divided among the tenants holding slots) takes a slot from
//!   the tenant most above its own: that tenant's connection without fids quiet longest,
//!   else its newest;
//! - when a charge is refused although the connection (or its tenant) holds less than
//!   its fair share of the memory budget, the connection holding the most memory beyond
//!   its fair share — within a tenant above the tenant's share, the tenant's share
//!   divided among its connections — *that it is not using* — state it holds (fids, xattr values, locks) beyond its share,
//!   or replies it has not read or a frame it has not finished sending for
//!   [`Timeouts::stall_ns`] — is closed, and its memory comes back when its teardown
//!   ends. Work in progress is never reclaimed: it gives its memory back by itself.

use alloc::collections::BTreeMap;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::sync::atomic::Ordering::Relaxed;

use vfs::FileSystem;

use super::session::Session;
use super::tenant::Tenant;
use super::Server;
use crate::conn::CloseReason;
use crate::memory::Refused;

/// Deadlines, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From connecting to a successful `Tversion`.
    pub handshake_ns: u64,
    /// Quiet time after which a connection without fids is closed.
    pub idle_ns: u64,
    /// How long replies may wait unread, or a frame unfinished, before their memory
    /// counts as unused.
    pub stall_ns: u64,
    /// How long a connection without fids must have been quiet before its slot can go to
    /// a new client.
    pub slot_grace_ns: u64,
}

const SECOND: u64 = 1_000_000_000;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake_ns: 10 * SECOND,
            idle_ns: 60 * SECOND,
            stall_ns: 2 * SECOND,
            slot_grace_ns: SECOND,
        }
    }
}

impl<F: FileSystem> Server<F> {
    /// The open sessions (pruning those already gone).
    ///
    /// The caller holds them outside the registry's lock: a session whose connection
    /// ended meanwhile is dropped by the caller, not under the lock.
    pub(super) fn live_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.with(live_in)
    }

    /// Closes the connections past their deadlines; returns how many. Call it every
    /// second or so.
    pub fn sweep(&self) -> usize {
        if self.config.clock.is_none() {
            return 0;
        }
        let now = self.now();
        let t = self.config.timeouts;
        let mut closed = 0;
        for s in self.live_sessions() {
            if s.close_requested().is_some() {
                continue;
            }
            let a = s.activity();
            let reason = if !s.versioned() && now.saturating_sub(a.opened) >= t.handshake_ns {
                self.counters.handshake_timeouts();
                CloseReason::HandshakeTimeout
            } else if s.fid_count() == 0
                && a.outstanding == 0
                && now.saturating_sub(a.last) >= t.idle_ns
            {
                self.counters.idle_timeouts();
                CloseReason::IdleTimeout
            } else {
                continue;
            };
            log::debug!("9p: conn {}: closing: {reason:?}", s.id());
            s.request_close(reason);
            closed += 1;
        }
        closed
    }

    /// Starts a shutdown: asks every connection, and any opened from now on, to close
    /// politely ([`CloseReason::Shutdown`]: no new request is read, those in flight
    /// finish and their replies are sent). Returns how many were open. The transport's
    /// owner stops accepting, waits for the connections to end, and may shed those that
    /// take too long with [`Server::shut_down_now`].
    pub fn shut_down(&self) -> usize {
        let open = self.close_registration();
        for s in &open {
            s.request_close(CloseReason::Shutdown);
        }
        open.len()
    }

    /// Whether [`Server::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Relaxed)
    }

    /// Marks the server as shutting down and returns the sessions open now: under the
    /// registry's lock, so a session registered at the same time is in the list or sees
    /// the mark ([`Server::new_session`]).
    fn close_registration(&self) -> Vec<Arc<Session>> {
        self.sessions.with(|registry| {
            self.shutting_down.store(true, Relaxed);
            live_in(registry)
        })
    }

    /// Sheds every connection still open during a shutdown
    /// ([`CloseReason::ShutdownNow`]: unsent replies are dropped; requests in flight
    /// still finish at teardown, so the filesystem is left with no operation running).
    /// Returns how many.
    pub fn shut_down_now(&self) -> usize {
        let open = self.close_registration();
        for s in &open {
            log::warn!("9p: conn {}: closing: shutdown grace time over", s.id());
            s.request_close(CloseReason::ShutdownNow);
        }
        open.len()
    }

    /// Frees a connection slot for a new client: closes the connection without fids and
    /// without outstanding requests that has been quiet longest (at least
    /// [`Timeouts::slot_grace_ns`]). Returns whether one was found (its slot is free once
    /// its teardown ends).
    pub fn reclaim_slot(&self) -> bool {
        self.reclaim_idle_slot(None)
    }

    /// As [`Server::reclaim_slot`], among the connections of `tenant` only: for a tenant
    /// at its own connection cap.
    pub fn reclaim_slot_in(&self, tenant: &Tenant) -> bool {
        self.reclaim_idle_slot(Some(tenant))
    }

    fn reclaim_idle_slot(&self, tenant: Option<&Tenant>) -> bool {
        let now = self.now();
        let grace = if self.config.clock.is_some() {
            self.config.timeouts.slot_grace_ns
        } else {
            0
        };
        let victim = self
            .live_sessions()
            .into_iter()
            .filter(|s| s.close_requested().is_none())
            .filter(|s| tenant.is_none_or(|t| s.tenant().id() == t.id()))
            .filter(|s| s.fid_count() == 0 && s.activity().outstanding == 0)
            .filter(|s| now.saturating_sub(s.activity().last) >= grace)
            .min_by_key(|s| s.activity().last);
        let Some(victim) = victim else {
            return false;
        };
        self.counters.slot_reclaims();
        log::debug!(
            "9p: conn {}: closing: its slot went to a new client",
            victim.id()
        );
        victim.request_close(CloseReason::SlotReclaimed);
        true
    }

    /// Frees a connection slot at the connection limit `total` for a new connection of
    /// `tenant` (its slot already taken), if the tenant holds no more than its fair share:
    /// closes a connection of the tenant most above its own share (see the module
    /// documentation). Returns whether one was found (its slot is free once its teardown
    /// ends).
    pub fn reclaim_slot_for(&self, tenant: &Tenant, total: usize) -> bool {
        let tenants = &self.tenants;
        if tenant.conns() > tenants.fair_slots(tenant, total) {
            return false;
        }
        let over = tenants
            .all()
            .into_iter()
            .filter(|t| t.id() != tenant.id() && t.conns() > tenants.fair_slots(t, total))
            .max_by_key(|t| t.conns());
        let Some(over) = over else {
            return false;
        };
        let now = self.now();
        let victim = self
            .live_sessions()
            .into_iter()
            .filter(|s| s.tenant().id() == over.id() && s.close_requested().is_none())
            // Without fids and quiet longest first, else the newest.
            .max_by_key(|s| {
                let quiet = now.saturating_sub(s.activity().last);
                (
                    s.fid_count() == 0,
                    if s.fid_count() == 0 { quiet } else { 0 },
                    s.id(),
                )
            });
        let Some(victim) = victim else {
            return false;
        };
        self.counters.slot_reclaims();
        tenants.slot_refused(&over);
        log::debug!(
            "9p: conn {}: closing: tenant {} holds {} connections, more than its share; the slot goes to tenant {}",
            victim.id(),
            over.key(),
            over.conns(),
            tenant.key()
        );
        victim.request_close(CloseReason::SlotReclaimed);
        true
    }

    /// What a refused charge `r` of `requester` asks of housekeeping: memory reclaimed
    /// from the server's connections ([`Server::reclaim_memory`]) or from its tenant's
    /// ([`Server::reclaim_in_tenant`]) if it was below its share. Returns whether memory
    /// will come back.
    pub fn reclaim_for(&self, requester: &Session, r: Refused) -> bool {
        match r {
            Refused::Server { below_share: true } => self.reclaim_memory(requester),
            Refused::Tenant { below_share: true } => self.reclaim_in_tenant(requester),
            _ => false,
        }
    }

    /// Reclaims memory for `requester`, which was refused a charge while it (or its
    /// tenant) held less than its fair share: closes the connection that holds the most
    /// memory beyond its share without using it (see the module documentation). Returns
    /// whether one was closed, or is already closing and will give memory back.
    pub fn reclaim_memory(&self, requester: &Session) -> bool {
        let share = self.budget.fair_share();
        let group_share = self.budget.group_share();
        let lean_tenant = requester.tenant().memory().charged() < group_share;
        self.reclaim_from(requester, |s| {
            let group = s.tenant().memory();
            // A connection of another tenant above its share, reclaimed for a tenant
            // below: its share is its tenant's, divided among the tenant's connections.
            let over_tenant = lean_tenant
                && s.tenant().id() != requester.tenant().id()
                && group.charged() > group_share;
            if over_tenant {
                Some((true, share.min(group_share / group.accounts().max(1))))
            } else {
                Some((false, share))
            }
        })
    }

    /// Reclaims memory for `requester`, refused a charge at its tenant's share while
    /// holding less than its part of it: as [`Server::reclaim_memory`], among the
    /// tenant's connections, each with the tenant's share divided among them.
    pub fn reclaim_in_tenant(&self, requester: &Session) -> bool {
        let tenant = requester.tenant();
        let share = self.config.memory.per_tenant / tenant.memory().accounts().max(1);
        self.reclaim_from(requester, |s| {
            (s.tenant().id() == tenant.id()).then_some((false, share))
        })
    }

    /// Closes, for `requester`, the connection that holds the most memory beyond its
    /// share without using it: `share_of` says for each connection whether it may be a
    /// victim, with what share, and whether it ranks first (its tenant is above its own
    /// share).
    fn reclaim_from(
        &self,
        requester: &Session,
        share_of: impl Fn(&Session) -> Option<(bool, usize)>,
    ) -> bool {
        let now = self.now();
        let stall = self.config.timeouts.stall_ns;
        let mut victim: Option<((bool, usize), usize, Arc<Session>)> = None;
        for s in self.live_sessions() {
            if s.id() == requester.id() {
                continue;
            }
            let Some((over_tenant, share)) = share_of(&s) else {
                continue;
            };
            let account = s.account();
            let charged = account.charged();
            if charged <= share {
                continue;
            }
            if s.close_requested().is_some() {
                // Its memory is already on its way back.
                return true;
            }
            // Without a clock, waiting memory counts as unused at once.
            let grace = if self.config.clock.is_some() {
                stall
            } else {
                0
            };
            if !(s.activity().stalled(now, grace) || account.held() > share) {
                continue;
            }
            let rank = (over_tenant, charged);
            if victim.as_ref().is_none_or(|(most, _, _)| rank > *most) {
                victim = Some((rank, share, s));
            }
        }
        let Some(((_, charged), share, victim)) = victim else {
            return false;
        };
        self.counters.memory_reclaims();
        log::debug!(
            "9p: conn {}: closing: holds {} KiB of the memory budget (fair share {} KiB) without using it",
            victim.id(),
            charged >> 10,
            share >> 10
        );
        victim.request_close(CloseReason::MemoryReclaimed);
        true
    }
}

/// The sessions of `registry` still open, pruning those already gone.
fn live_in(registry: &mut BTreeMap<u64, Weak<Session>>) -> Vec<Arc<Session>> {
    let mut live = Vec::with_capacity(registry.len());
    registry.retain(|_, w| match w.upgrade() {
        Some(s) => {
            live.push(s);
            true
        }
        None => false,
    });
    live
}

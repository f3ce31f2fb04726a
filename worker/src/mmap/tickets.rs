//! The ticket store: single-use, expiring, bounded tickets bound to an instance, an open file
//! and a thread group.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Result;
use cuse_dev::Errno;
use nvproxy_preload_proto::MmapTicketArgs;

/// One outstanding ticket.
#[derive(Debug, Clone)]
pub struct Ticket<T> {
    /// What to ask for the mapping fd (the node's backend, in the daemon).
    pub target: T,
    /// The open file the ticket was issued on.
    pub fh: u64,
    /// The thread group that asked for it (the only peer that may redeem it).
    pub tgid: u32,
    /// When it stops being valid.
    pub expires: Instant,
    /// The mmap call it was issued for (logged).
    pub args: MmapTicketArgs,
}

/// Why a ticket was not redeemed. Whatever the reason, the peer gets nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such ticket (never issued here, already used, or dropped with its open file).
    Unknown,
    /// The ticket's time is up (it is dropped).
    Expired,
    /// The ticket belongs to another thread group (it stays valid for its owner).
    WrongPeer {
        /// The ticket's thread group.
        owner: u32,
    },
}

struct Tickets<T> {
    map: HashMap<u64, Ticket<T>>,
    random: Box<dyn FnMut() -> io::Result<u64> + Send>,
}

/// One instance's tickets.
pub struct TicketStore<T> {
    inner: Mutex<Tickets<T>>,
    ttl: Duration,
    max: usize,
}

impl<T: Clone> TicketStore<T> {
    /// A store whose tickets come from `random`, live `ttl` and number at most `max`.
    pub fn new(
        ttl: Duration,
        max: usize,
        random: Box<dyn FnMut() -> io::Result<u64> + Send>,
    ) -> Self {
        TicketStore {
            inner: Mutex::new(Tickets {
                map: HashMap::new(),
                random,
            }),
            ttl,
            max,
        }
    }

    /// A store with tickets from `/dev/urandom`.
    pub fn with_urandom(ttl: Duration, max: usize) -> io::Result<Self> {
        let mut urandom = File::open("/dev/urandom")?;
        Ok(Self::new(
            ttl,
            max,
            Box::new(move || {
                let mut b = [0u8; 8];
                urandom.read_exact(&mut b)?;
                Ok(u64::from_ne_bytes(b))
            }),
        ))
    }

    fn lock(&self) -> MutexGuard<'_, Tickets<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Issues a ticket for open file `fh` (reached through `target`) to thread group `tgid`.
    /// `EAGAIN` when [`super::MAX_TICKETS`] live tickets are out; `EIO` when no random number
    /// can be had.
    pub fn issue(
        &self,
        target: T,
        fh: u64,
        tgid: u32,
        args: MmapTicketArgs,
        now: Instant,
    ) -> Result<u64, Errno> {
        let mut t = self.lock();
        t.map.retain(|_, k| k.expires > now);
        if t.map.len() >= self.max {
            return Err(Errno::EAGAIN);
        }
        let id = loop {
            let id = (t.random)().map_err(|e| {
                tracing::error!(error = %e, "no random number for an mmap ticket");
                Errno::EIO
            })?;
            if id != 0 && !t.map.contains_key(&id) {
                break id;
            }
        };
        t.map.insert(
            id,
            Ticket {
                target,
                fh,
                tgid,
                expires: now + self.ttl,
                args,
            },
        );
        Ok(id)
    }

    /// Redeems `ticket` for a peer whose thread group is `peer`: the ticket, removed, or why not.
    pub fn redeem(&self, ticket: u64, peer: u32, now: Instant) -> Result<Ticket<T>, Refusal> {
        let mut t = self.lock();
        let Some(k) = t.map.get(&ticket) else {
            return Err(Refusal::Unknown);
        };
        if k.tgid != peer {
            return Err(Refusal::WrongPeer { owner: k.tgid });
        }
        let k = t.map.remove(&ticket).ok_or(Refusal::Unknown)?;
        if k.expires <= now {
            return Err(Refusal::Expired);
        }
        Ok(k)
    }

    /// Drops every ticket for which `issued_on(target, fh)` holds (its open file is gone).
    pub fn forget(&self, issued_on: impl Fn(&T, u64) -> bool) {
        self.lock().map.retain(|_, k| !issued_on(&k.target, k.fh));
    }

    /// The live tickets, with the time each has left (a live upgrade carries them over).
    pub fn export(&self, now: Instant) -> Vec<(u64, Ticket<T>, Duration)> {
        self.lock()
            .map
            .iter()
            .filter(|(_, k)| k.expires > now)
            .map(|(&id, k)| (id, k.clone(), k.expires - now))
            .collect()
    }

    /// Takes tickets another store issued ([`TicketStore::export`]), each valid for the time
    /// it had left (at most this store's ttl); past the bound the rest are dropped.
    pub fn import(&self, tickets: Vec<(u64, Ticket<T>, Duration)>, now: Instant) {
        let mut t = self.lock();
        for (id, mut k, left) in tickets {
            if id == 0 || t.map.len() >= self.max {
                continue;
            }
            k.expires = now + left.min(self.ttl);
            t.map.insert(id, k);
        }
    }

    /// Live tickets.
    #[cfg(test)]
    pub fn outstanding(&self, now: Instant) -> usize {
        self.lock().map.values().filter(|k| k.expires > now).count()
    }
}

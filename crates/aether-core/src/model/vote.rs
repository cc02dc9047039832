//! One truth per port: the class vote and the legacy-target vote (spec/model.md §6.1, §7).
//!
//! Layer 0 (pure). Both votes are independent of the order rows arrive in.

use crate::prelude::*;

use std::collections::BTreeMap;

use crate::model::port::PortProtocol;
use crate::model::rows::PortProtocols;

/// Counts of one port's protocols over a set of rows (one vote per row).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Rows declaring the port HTTP.
    pub http: u32,
    /// Rows declaring the port raw TCP.
    pub tcp: u32,
    /// Rows declaring the port UDP.
    pub udp: u32,
}

impl Tally {
    /// Adds one row's vote.
    pub fn add(&mut self, p: PortProtocol) {
        match p {
            PortProtocol::Http => self.http += 1,
            PortProtocol::Tcp => self.tcp += 1,
            PortProtocol::Udp => self.udp += 1,
        }
    }

    /// Takes one row's vote back.
    pub fn remove(&mut self, p: PortProtocol) {
        let n = match p {
            PortProtocol::Http => &mut self.http,
            PortProtocol::Tcp => &mut self.tcp,
            PortProtocol::Udp => &mut self.udp,
        };
        *n = n.saturating_sub(1);
    }

    /// Whether no row votes.
    pub fn is_empty(&self) -> bool {
        self.http == 0 && self.tcp == 0 && self.udp == 0
    }

    /// The winner: the highest count; a tie goes to HTTP, then TCP, then UDP.
    pub fn winner(&self) -> Option<PortProtocol> {
        let mut best: Option<(u32, PortProtocol)> = None;
        for (n, p) in [
            (self.http, PortProtocol::Http),
            (self.tcp, PortProtocol::Tcp),
            (self.udp, PortProtocol::Udp),
        ] {
            if n > 0 && best.is_none_or(|(b, _)| n > b) {
                best = Some((n, p));
            }
        }
        best.map(|(_, p)| p)
    }

    /// Whether the rows disagree (more than one protocol has votes).
    pub fn disagrees(&self) -> bool {
        [self.http, self.tcp, self.udp]
            .iter()
            .filter(|&&n| n > 0)
            .count()
            > 1
    }
}

/// The class vote over rows, each given as its port → protocol map.
pub fn vote<'a>(rows: impl IntoIterator<Item = &'a PortProtocols>) -> BTreeMap<u16, Tally> {
    let mut tallies: BTreeMap<u16, Tally> = BTreeMap::new();
    for row in rows {
        for (&port, &p) in row {
            tallies.entry(port).or_default().add(p);
        }
    }
    tallies
}

/// The legacy target: the declared port most rows carry; a tie goes to the lowest number.
pub fn legacy_target(declared: impl IntoIterator<Item = u16>) -> Option<u16> {
    let mut counts: BTreeMap<u16, u32> = BTreeMap::new();
    for p in declared {
        *counts.entry(p).or_default() += 1;
    }
    let mut best: Option<(u32, u16)> = None;
    // Ascending port order: a later port wins only with a strictly higher count.
    for (p, n) in counts {
        if best.is_none_or(|(b, _)| n > b) {
            best = Some((n, p));
        }
    }
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use PortProtocol::*;

    fn winner(votes: &[PortProtocol]) -> Option<PortProtocol> {
        let mut t = Tally::default();
        votes.iter().for_each(|&p| t.add(p));
        t.winner()
    }

    #[test]
    fn the_class_vote_follows_u2() {
        assert_eq!(winner(&[Http, Http, Tcp]), Some(Http));
        assert_eq!(winner(&[Tcp, Http, Http]), Some(Http));
        assert_eq!(winner(&[Http, Tcp]), Some(Http));
        assert_eq!(winner(&[Tcp, Http]), Some(Http));
        assert_eq!(winner(&[Tcp, Udp]), Some(Tcp));
        assert_eq!(winner(&[Udp, Tcp]), Some(Tcp));
        assert_eq!(winner(&[Tcp, Tcp, Http]), Some(Tcp));
        assert_eq!(winner(&[]), None);
    }

    #[test]
    fn the_legacy_target_is_the_most_carried_then_the_lowest() {
        assert_eq!(legacy_target([9000, 8080, 9000]), Some(9000));
        assert_eq!(legacy_target([9000, 8080]), Some(8080));
        assert_eq!(legacy_target([8080, 9000]), Some(8080));
        assert_eq!(legacy_target([]), None);
    }
}

//! Who may use the server, and the one parser of the access options that the kernel
//! command line and `ninefold serve` share.
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `export=NAME:PATH[:OPT]...` | export directory PATH under aname NAME (repeatable; NAME may be empty). OPT: `ro`, `rw`, `squash=root\|all\|none`, `anonuid=N`, `anongid=N`, `allow=CIDR[,CIDR...]` | the whole filesystem at aname `""` |
//! | `allow=CIDR[,CIDR...]` | clients allowed by exports that name no `allow=` | `any` |
//! | `group=UID:GID[,GID...]` | group membership of a uid for permission checks (repeatable) | none |
//! | `stats_allow=CIDR[,CIDR...]` | clients allowed on the counters port | the `allow=` list |
//! | `admin_allow=CIDR[,CIDR...]` | enables the administration export (aname `ctl`, [`crate::admin`]) for these clients | off |
//!
//! A CIDR is an IPv4 or IPv6 network (`10.0.2.0/24`, `fd00::/8`), a bare address (one
//! host), or `any` (as is `0.0.0.0/0`): every client, including one whose address the
//! transport does not know. IPv6 networks work inside an export's options too: an
//! option field that is not an option continues the `allow=` list before it.
//!
//! **Without any `export=`** the whole filesystem is exported at aname `""` (read-write,
//! no squashing, for the `allow=` list); **once exports are named, only they exist**.
//! A later `export=` with the same NAME, `group=` with the same UID, or `allow=`/
//! `stats_allow=` replaces the earlier one. Errors are short static reasons, so a
//! command-line parser can report them with the option as written.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::IpAddr;

use super::export::{Export, Squash, CPU_WEIGHTS, DEFAULT_CPU_WEIGHT, NOBODY};
use super::Config;

/// An IP network: the addresses whose first `prefix` bits are `network`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network `network/prefix`: the prefix must fit the address family and
    /// `network` have no bits set past it (`10.0.2.15/24` is refused: which was meant,
    /// the host or the network?).
    pub fn new(network: IpAddr, prefix: u8) -> Result<Cidr, &'static str> {
        let bits = match network {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > bits {
            return Err("prefix length too long for the address");
        }
        let cidr = Cidr { network, prefix };
        if !cidr.contains_same_family(network, true) {
            return Err("address has bits set past the prefix length");
        }
        Ok(cidr)
    }

    /// The network's address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `addr` is in the network (an IPv4-mapped IPv6 address counts as the IPv4
    /// address it carries, as a dual-stack socket reports IPv4 clients).
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.contains_same_family(addr.to_canonical(), false)
    }

    /// `addr` is in the network; with `exact`, `addr` must also have no host bits (it is
    /// the network address itself).
    fn contains_same_family(&self, addr: IpAddr, exact: bool) -> bool {
        let (net, addr, bits) = match (self.network, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                (u128::from(u32::from(n)), u128::from(u32::from(a)), 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => (u128::from(n), u128::from(a), 128),
            _ => return false,
        };
        // The prefix's bits of a `bits`-wide address (none for /0).
        let width_mask = u128::MAX >> (128 - bits);
        let prefix_mask = width_mask & !width_mask.checked_shr(self.prefix.into()).unwrap_or(0);
        if exact {
            addr & !prefix_mask == 0
        } else {
            (addr ^ net) & prefix_mask == 0
        }
    }

    /// Parses `ADDR/PREFIX` or a bare `ADDR` (one host).
    pub fn parse(s: &str) -> Result<Cidr, &'static str> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| "expected an IPv4 or IPv6 address, ADDR/PREFIX or any")?;
        let prefix = match prefix {
            None => match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p
                .parse()
                .map_err(|_| "prefix length too long for the address")?,
            Some(_) => return Err("prefix length must be a number"),
        };
        Cidr::new(addr, prefix)
    }
}

/// A host is written as its bare address, a network as `ADDR/PREFIX`.
impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.network, self.prefix) {
            (IpAddr::V4(_), 32) | (IpAddr::V6(_), 128) => write!(f, "{}", self.network),
            (network, prefix) => write!(f, "{network}/{prefix}"),
        }
    }
}

/// The clients something (an export, the counters port) may be used by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AllowList {
    /// Every client, also one whose address is unknown (in-memory transports).
    #[default]
    Any,
    /// Clients in one of these networks.
    Only(Vec<Cidr>),
}

impl AllowList {
    /// Whether a client at `peer` is allowed; an unknown address only by [`AllowList::Any`].
    pub fn admits(&self, peer: Option<IpAddr>) -> bool {
        match (self, peer) {
            (AllowList::Any, _) => true,
            (AllowList::Only(networks), Some(addr)) => networks.iter().any(|n| n.contains(addr)),
            (AllowList::Only(_), None) => false,
        }
    }

    /// Parses `CIDR[,CIDR...]`; `any` (or `0.0.0.0/0`) anywhere in it allows every client.
    pub fn parse(s: &str) -> Result<AllowList, &'static str> {
        let mut networks = Vec::new();
        let mut any = false;
        for item in s.split(',') {
            match item {
                "" => return Err("empty address in the list"),
                "any" => any = true,
                _ => {
                    let cidr = Cidr::parse(item)?;
                    any |= cidr == ANY_IPV4;
                    networks.push(cidr);
                }
            }
        }
        Ok(if any {
            AllowList::Any
        } else {
            AllowList::Only(networks)
        })
    }
}

/// `0.0.0.0/0`, which the option syntax takes to mean `any`.
const ANY_IPV4: Cidr = Cidr {
    network: IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
    prefix: 0,
};

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowList::Any => f.write_str("any"),
            AllowList::Only(networks) => {
                for (i, n) in networks.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{n}")?;
                }
                Ok(())
            }
        }
    }
}

/// The access options as given (`export=`, `allow=`, `group=`, `stats_allow=`), and the
/// server configuration they make. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessConfig {
    exports: Vec<Export>,
    allow: AllowList,
    stats_allow: Option<AllowList>,
    admin_allow: Option<AllowList>,
    groups: BTreeMap<u32, Vec<u32>>,
}

impl AccessConfig {
    /// Adds an export from `NAME:PATH[:OPT]...` (replacing one of the same name).
    pub fn add_export(&mut self, spec: &str) -> Result<(), &'static str> {
        let export = parse_export(spec)?;
        self.exports.retain(|e| e.name != export.name);
        self.exports.push(export);
        Ok(())
    }

    /// Sets the allow-list of exports that name none (`allow=`).
    pub fn set_allow(&mut self, list: &str) -> Result<(), &'static str> {
        self.allow = AllowList::parse(list)?;
        Ok(())
    }

    /// Sets the allow-list of the counters port (`stats_allow=`).
    pub fn set_stats_allow(&mut self, list: &str) -> Result<(), &'static str> {
        self.stats_allow = Some(AllowList::parse(list)?);
        Ok(())
    }

    /// Enables the administration export (`ctl`, [`crate::admin`]) for the clients of
    /// `list` (`admin_allow=`; without it there is none).
    pub fn set_admin_allow(&mut self, list: &str) -> Result<(), &'static str> {
        self.admin_allow = Some(AllowList::parse(list)?);
        Ok(())
    }

    /// Who may attach to the administration export; `None`: it is off.
    pub fn admin_allow(&self) -> Option<&AllowList> {
        self.admin_allow.as_ref()
    }

    /// Adds a uid's groups from `UID:GID[,GID...]` (replacing that uid's earlier entry).
    pub fn add_group(&mut self, spec: &str) -> Result<(), &'static str> {
        const EXPECTED: &str = "expected UID:GID[,GID...]";
        let (uid, gids) = spec.split_once(':').ok_or(EXPECTED)?;
        let uid = parse_id(uid).ok_or(EXPECTED)?;
        let gids = gids
            .split(',')
            .map(parse_id)
            .collect::<Option<Vec<u32>>>()
            .ok_or(EXPECTED)?;
        self.groups.insert(uid, gids);
        Ok(())
    }

    /// The exports named, in order (empty: the implicit one applies).
    pub fn named_exports(&self) -> &[Export] {
        &self.exports
    }

    /// The allow-list of exports that name none.
    pub fn allow(&self) -> &AllowList {
        &self.allow
    }

    /// Who may read the counters port: `stats_allow=`, else the `allow=` list.
    pub fn stats_allow(&self) -> &AllowList {
        self.stats_allow.as_ref().unwrap_or(&self.allow)
    }

    /// Group membership by uid.
    pub fn groups(&self) -> &BTreeMap<u32, Vec<u32>> {
        &self.groups
    }

    /// `base` with these exports, allow-list and groups. Without named exports, the one
    /// export is `implicit` (the whole filesystem at aname `""`, with whatever options
    /// the caller gives it, e.g. `ninefold serve --read-only`).
    pub fn server_config(&self, implicit: Export, base: Config) -> Config {
        let mut exports = if self.exports.is_empty() {
            alloc::vec![implicit]
        } else {
            self.exports.clone()
        };
        if let Some(list) = &self.admin_allow {
            exports.push(Export::admin(list.clone()));
        }
        Config {
            exports,
            allow: self.allow.clone(),
            groups: self.groups.clone(),
            ..base
        }
    }
}

/// The options that differ from the defaults, space-separated, in the syntax they are
/// parsed from (nothing for the defaults).
impl fmt::Display for AccessConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        let mut next = |f: &mut fmt::Formatter<'_>| {
            let s = sep;
            sep = " ";
            f.write_str(s)
        };
        for e in &self.exports {
            next(f)?;
            write!(f, "export={e}")?;
        }
        if self.allow != AllowList::Any {
            next(f)?;
            write!(f, "allow={}", self.allow)?;
        }
        if let Some(list) = &self.stats_allow {
            next(f)?;
            write!(f, "stats_allow={list}")?;
        }
        if let Some(list) = &self.admin_allow {
            next(f)?;
            write!(f, "admin_allow={list}")?;
        }
        for (uid, gids) in &self.groups {
            next(f)?;
            write!(f, "group={uid}:")?;
            for (i, gid) in gids.iter().enumerate() {
                write!(f, "{}{gid}", if i > 0 { "," } else { "" })?;
            }
        }
        Ok(())
    }
}

/// An export in `export=` syntax: `NAME:PATH`, then the options that differ from the
/// defaults.
impl fmt::Display for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.path)?;
        if self.read_only {
            f.write_str(":ro")?;
        }
        match self.squash {
            Squash::None => {}
            Squash::Root => f.write_str(":squash=root")?,
            Squash::All => f.write_str(":squash=all")?,
        }
        if self.anon_uid != NOBODY {
            write!(f, ":anonuid={}", self.anon_uid)?;
        }
        if self.anon_gid != NOBODY {
            write!(f, ":anongid={}", self.anon_gid)?;
        }
        if let Some(list) = &self.allow {
            write!(f, ":allow={list}")?;
        }
        if let Some(q) = &self.quota {
            if let Some(bytes) = q.bytes {
                write!(f, ":quota={bytes}")?;
            }
            if let Some(inodes) = q.inodes {
                write!(f, ":inodes={inodes}")?;
            }
        }
        if self.weight != DEFAULT_CPU_WEIGHT {
            write!(f, ":weight={}", self.weight)?;
        }
        Ok(())
    }
}

pub use vfs::parse_size;

/// A uid or gid: decimal digits only.
fn parse_id(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The option keywords of an export (fields that start otherwise continue an `allow=`).
fn is_export_option(field: &str) -> bool {
    matches!(field, "ro" | "rw")
        || [
            "squash=", "anonuid=", "anongid=", "allow=", "quota=", "inodes=", "weight=",
        ]
        .iter()
        .any(|k| field.starts_with(k))
}

/// Parses `NAME:PATH[:OPT]...`.
fn parse_export(spec: &str) -> Result<Export, &'static str> {
    let mut fields = spec.split(':');
    let name = fields.next().unwrap_or_default();
    let path = fields.next().ok_or("expected NAME:PATH[:OPTION]...")?;
    let mut export = Export::root(name);
    export.path = normalize_path(path)?;
    // Options, with the fields of an IPv6 `allow=` list glued back together.
    let mut options: Vec<String> = Vec::new();
    for field in fields {
        match options.last_mut() {
            Some(last) if last.starts_with("allow=") && !is_export_option(field) => {
                last.push(':');
                last.push_str(field);
            }
            _ => options.push(field.into()),
        }
    }
    for option in &options {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option.as_str(), None),
        };
        match (key, value) {
            ("ro", None) => export.read_only = true,
            ("rw", None) => export.read_only = false,
            ("squash", Some(v)) => {
                export.squash = match v {
                    "none" => Squash::None,
                    "root" => Squash::Root,
                    "all" => Squash::All,
                    _ => return Err("expected squash=root, squash=all or squash=none"),
                }
            }
            ("anonuid", Some(v)) => export.anon_uid = parse_id(v).ok_or("anonuid: not a uid")?,
            ("anongid", Some(v)) => export.anon_gid = parse_id(v).ok_or("anongid: not a gid")?,
            ("allow", Some(v)) => export.allow = Some(AllowList::parse(v)?),
            ("quota", Some(v)) => {
                export.quota.get_or_insert_with(Default::default).bytes = Some(parse_size(v)?)
            }
            ("inodes", Some(v)) => {
                let n = v.parse().map_err(|_| "inodes: expected a number")?;
                export.quota.get_or_insert_with(Default::default).inodes = Some(n)
            }
            ("weight", Some(v)) => {
                export.weight = v
                    .parse()
                    .ok()
                    .filter(|w| CPU_WEIGHTS.contains(w))
                    .ok_or("weight: expected 1-10000")?
            }
            _ => return Err(
                "unknown export option (ro, rw, squash=, anonuid=, anongid=, allow=, quota=, inodes=, weight=)",
            ),
        }
    }
    Ok(export)
}

/// An export path: absolute, without `.` or `..` components, written `/a/b` (`/` for
/// the root).
fn normalize_path(path: &str) -> Result<String, &'static str> {
    if !path.starts_with('/') {
        return Err("export path must start with /");
    }
    let mut out = String::new();
    for component in path.split('/').filter(|c| !c.is_empty()) {
        if component == "." || component == ".." {
            return Err("export path may not contain . or ..");
        }
        out.push('/');
        out.push_str(component);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use core::net::{Ipv4Addr, Ipv6Addr};

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn cidrs_contain_their_networks_addresses() {
        let net = Cidr::parse("10.0.2.0/24").unwrap();
        assert!(net.contains(v4(10, 0, 2, 2)));
        assert!(net.contains(v4(10, 0, 2, 255)));
        assert!(!net.contains(v4(10, 0, 3, 2)));
        let host = Cidr::parse("10.0.2.2").unwrap();
        assert_eq!(host.prefix(), 32);
        assert!(host.contains(v4(10, 0, 2, 2)) && !host.contains(v4(10, 0, 2, 3)));
        let odd = Cidr::parse("192.168.4.0/22").unwrap();
        assert!(odd.contains(v4(192, 168, 7, 1)) && !odd.contains(v4(192, 168, 8, 1)));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!(!v6.contains(v4(10, 0, 2, 2)), "families never mix");
        // A dual-stack socket's IPv4 client.
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 2, 2).to_ipv6_mapped());
        assert!(net.contains(mapped));
        assert!(Cidr::parse("::/0")
            .unwrap()
            .contains(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(v4(1, 2, 3, 4)));
    }

    #[test]
    fn malformed_cidrs_are_refused() {
        for bad in [
            "10.0.2.15/24",
            "10.0.2.0/33",
            "fd00::/129",
            "10.0.2.0/",
            "10.0.2.0/+8",
            "10.0.2",
            "host",
            "/24",
            "fd00::1/64",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn allow_lists() {
        let list = AllowList::parse("10.0.2.0/24,192.168.1.7").unwrap();
        assert!(list.admits(Some(v4(10, 0, 2, 9))));
        assert!(list.admits(Some(v4(192, 168, 1, 7))));
        assert!(!list.admits(Some(v4(192, 168, 1, 8))));
        assert!(!list.admits(None), "an unknown peer is not in any network");
        assert_eq!(list.to_string(), "10.0.2.0/24,192.168.1.7");
        for any in ["any", "0.0.0.0/0", "10.0.0.1,any"] {
            let list = AllowList::parse(any).unwrap();
            assert_eq!(list, AllowList::Any, "{any}");
            assert!(list.admits(None));
        }
        // Every IPv6 address, but not an unknown peer.
        assert!(!AllowList::parse("::/0").unwrap().admits(None));
        for bad in ["", "10.0.0.1,", ",10.0.0.1", "10.0.0.1,,any", "none"] {
            assert!(AllowList::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn config(options: &[(&str, &str)]) -> Result<AccessConfig, &'static str> {
        let mut c = AccessConfig::default();
        for (key, value) in options {
            match *key {
                "export" => c.add_export(value)?,
                "allow" => c.set_allow(value)?,
                "stats_allow" => c.set_stats_allow(value)?,
                "admin_allow" => c.set_admin_allow(value)?,
                "group" => c.add_group(value)?,
                _ => unreachable!(),
            }
        }
        Ok(c)
    }

    #[test]
    fn export_specs() {
        let c = config(&[
            ("export", ":/srv:ro"),
            (
                "export",
                "data:/srv//data/:squash=all:anonuid=1000:anongid=100:allow=10.0.2.0/24,fd00::/8",
            ),
            ("export", "six:/:allow=fd00::1:ro:allow=::1"),
            ("export", "rw:/x:ro:rw:squash=root:squash=none"),
            (
                "export",
                "q:/q:quota=1G:inodes=5000:allow=fd00::1:weight=300",
            ),
        ])
        .unwrap();
        let e = c.named_exports();
        assert_eq!(e.len(), 5);
        let quota = vfs::QuotaLimits {
            bytes: Some(1 << 30),
            inodes: Some(5000),
        };
        assert_eq!(e[4].quota, Some(quota));
        assert_eq!(
            e[4].to_string(),
            "q:/q:allow=fd00::1:quota=1073741824:inodes=5000:weight=300"
        );
        assert_eq!((e[4].weight, e[0].weight), (300, DEFAULT_CPU_WEIGHT));
        assert_eq!(e[0].quota, None);
        assert_eq!((e[0].name.as_str(), e[0].path.as_str()), ("", "/srv"));
        assert!(e[0].read_only && e[0].allow.is_none());
        assert_eq!(e[1].path, "/srv/data");
        assert_eq!(e[1].squash, Squash::All);
        assert_eq!((e[1].anon_uid, e[1].anon_gid), (1000, 100));
        let allow = e[1].allow.as_ref().unwrap();
        assert!(allow.admits(Some(v4(10, 0, 2, 2))));
        assert!(allow.admits(Some("fd00::7".parse().unwrap())));
        assert!(!allow.admits(Some(v4(10, 0, 3, 2))));
        // IPv6 colons are told apart from option separators; a later option wins.
        assert!(e[2].read_only);
        assert_eq!(e[2].allow, Some(AllowList::parse("::1").unwrap()));
        assert!(!e[3].read_only && e[3].squash == Squash::None);
        assert_eq!(
            e[1].to_string(),
            "data:/srv/data:squash=all:anonuid=1000:anongid=100:allow=10.0.2.0/24,fd00::/8"
        );
    }

    #[test]
    fn malformed_export_specs_are_refused() {
        for bad in [
            "",
            "name",
            "name:",
            "name:relative",
            "name:/a/../b",
            "name:/./b",
            "name:/:readonly",
            "name:/:ro=1",
            "name:/:squash=some",
            "name:/:squash",
            "name:/:anonuid=-1",
            "name:/:anonuid=",
            "name:/:anongid=x",
            "name:/:allow=",
            "name:/:allow=10.0.0.1/40",
            "name:/::ro",
            "name:/:quota=",
            "name:/:quota=1X",
            "name:/:inodes=many",
            "name:/:weight=0",
            "name:/:weight=10001",
            "name:/:weight=",
        ] {
            assert!(config(&[("export", bad)]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn groups_and_lists() {
        let c = config(&[
            ("group", "1000:100,200"),
            ("group", "0:0"),
            ("group", "1000:300"),
            ("allow", "10.0.2.2"),
        ])
        .unwrap();
        assert_eq!(c.groups().get(&1000), Some(&alloc::vec![300]));
        assert_eq!(c.groups().len(), 2);
        assert_eq!(c.stats_allow(), c.allow(), "stats_allow defaults to allow");
        let c = config(&[("stats_allow", "any"), ("allow", "10.0.2.2")]).unwrap();
        assert_eq!(c.stats_allow(), &AllowList::Any);
        for bad in [
            "1000",
            "1000:",
            ":100",
            "x:1",
            "1000:1,,2",
            "1000:1,y",
            "-1:2",
        ] {
            assert!(config(&[("group", bad)]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn implicit_export_only_without_named_ones() {
        let c = config(&[("allow", "10.0.2.0/24")]).unwrap();
        let server = c.server_config(Export::root(""), Config::default());
        assert_eq!(server.exports, alloc::vec![Export::root("")]);
        assert_eq!(server.allow, AllowList::parse("10.0.2.0/24").unwrap());
        let c = config(&[
            ("export", "a:/a"),
            ("export", "b:/b:ro"),
            ("export", "a:/c"),
        ])
        .unwrap();
        let server = c.server_config(Export::root(""), Config::default());
        let names: Vec<_> = server.exports.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["b", "a"],
            "no implicit export; a later `a` replaces the first"
        );
        assert_eq!(server.exports[1].path, "/c");
    }

    #[test]
    fn the_admin_export_is_off_until_admin_allow_names_its_clients() {
        let c = config(&[("export", "a:/a")]).unwrap();
        let server = c.server_config(Export::root(""), Config::default());
        assert!(super::super::export::select(&server.exports, b"ctl").is_none());
        let c = config(&[("export", "a:/a"), ("admin_allow", "10.0.2.2")]).unwrap();
        let server = c.server_config(Export::root(""), Config::default());
        let admin = super::super::export::select(&server.exports, b"ctl").unwrap();
        assert_eq!(admin.root_ino, Some(crate::admin::ADMIN_ROOT));
        let host: IpAddr = "10.0.2.2".parse().unwrap();
        let other: IpAddr = "10.0.2.3".parse().unwrap();
        assert!(server.allow_list(admin).admits(Some(host)));
        assert!(!server.allow_list(admin).admits(Some(other)));
        assert!(c.to_string().ends_with("admin_allow=10.0.2.2"));
    }

    #[test]
    fn display_parses_back_to_the_same_config() {
        let c = config(&[
            (
                "export",
                "data:/srv/data:squash=root:allow=10.0.2.0/24:quota=1048576",
            ),
            ("export", ":/:ro"),
            ("allow", "10.0.2.2,fd00::/8"),
            ("stats_allow", "127.0.0.1"),
            ("group", "1000:100,200"),
        ])
        .unwrap();
        let text = c.to_string();
        assert_eq!(
            text,
            "export=data:/srv/data:squash=root:allow=10.0.2.0/24:quota=1048576 export=:/:ro \
             allow=10.0.2.2,fd00::/8 stats_allow=127.0.0.1 group=1000:100,200"
        );
        let options: Vec<(&str, &str)> = text
            .split(' ')
            .map(|o| o.split_once('=').unwrap())
            .collect();
        assert_eq!(config(&options).unwrap(), c);
        assert_eq!(AccessConfig::default().to_string(), "");
    }
}

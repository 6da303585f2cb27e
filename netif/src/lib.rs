//! Choosing the network interface bootstrap listens on, the way NCCL does it.
//!
//! `NCCL_SOCKET_IFNAME` names interfaces: a comma list of name prefixes (`eth,ib`), `=` for
//! exact names (`=eth0`), `^` to exclude (`^docker,lo`), or both (`^=eth0`).
//! `NCCL_SOCKET_FAMILY` (`AF_INET` or `AF_INET6`) restricts the address family. Without a
//! user choice, the first interface that is up and is neither loopback nor `docker*` wins,
//! IPv4 before IPv6; then `docker*`; loopback is the last resort.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;

use nix::net::if_::InterfaceFlags;

/// What can go wrong choosing an interface: a user setting that matches nothing or does not
/// parse (`InvalidArgument`), or a machine without a usable interface (`System`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultCode {
    InvalidArgument,
    SystemError,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: ResultCode,
    pub message: String,
}

impl Error {
    fn invalid_argument(message: impl Into<String>) -> Error {
        Error { code: ResultCode::InvalidArgument, message: message.into() }
    }
    fn system(message: impl Into<String>) -> Error {
        Error { code: ResultCode::SystemError, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn env_str(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// One address of one network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
    pub up: bool,
    pub running: bool,
    pub loopback: bool,
}

impl Interface {
    /// Up and running: usable.
    fn usable(&self) -> bool {
        self.up && self.running
    }

    fn family(&self) -> Family {
        match self.addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Interface {
    /// `eth0 10.1.2.3 (up)`, `eth1 10.9.0.1 (down)`, `lo 127.0.0.1 (up, loopback)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match (self.up, self.running) {
            (true, true) => "up",
            (true, false) => "up, not running",
            (false, _) => "down",
        };
        let loopback = if self.loopback { ", loopback" } else { "" };
        write!(f, "{} {} ({state}{loopback})", self.name, self.addr)
    }
}

/// Whether `addr` is an IPv6 link-local address (fe80::/10), which NCCL skips.
fn is_ipv6_link_local(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

/// Every IPv4 and IPv6 address of every interface, in the order the system lists them,
/// without IPv6 link-local addresses.
pub fn list_interfaces() -> Result<Vec<Interface>> {
    let addrs =
        nix::ifaddrs::getifaddrs().map_err(|e| Error::system(format!("getifaddrs failed: {e}")))?;
    let mut out = Vec::new();
    for ifa in addrs {
        let Some(storage) = ifa.address else { continue };
        let addr = if let Some(v4) = storage.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = storage.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue; // AF_PACKET and other families
        };
        if is_ipv6_link_local(&addr) {
            continue;
        }
        out.push(Interface {
            name: ifa.interface_name,
            addr,
            up: ifa.flags.contains(InterfaceFlags::IFF_UP),
            running: ifa.flags.contains(InterfaceFlags::IFF_RUNNING),
            loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK),
        });
    }
    Ok(out)
}

/// An `NCCL_SOCKET_IFNAME` value: which interface names it selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfnameSpec {
    /// `^`: the names are excluded rather than selected.
    pub exclude: bool,
    /// `=`: whole names rather than prefixes.
    pub exact: bool,
    pub names: Vec<String>,
}

impl IfnameSpec {
    /// Parses `[^][=]name,name,...`.
    pub fn parse(spec: &str) -> IfnameSpec {
        let spec = spec.trim();
        let (exclude, spec) = match spec.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let (exact, spec) = match spec.strip_prefix('=') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let names =
            spec.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
        IfnameSpec { exclude, exact, names }
    }

    /// Whether the interface called `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| self.name_matches(n, name));
        listed != self.exclude
    }

    /// Whether port `port` of the device called `name` is selected, for the specs that name
    /// ports (`NCCL_IB_HCA`): an entry `mlx5_0:1` lists port 1 of `mlx5_0` only, an entry
    /// without a port lists every port. Fields after the port (NCCL's `:rail:plane`) are
    /// ignored; a port that is not a number lists no port (NCCL reads it as 0, and ports
    /// count from 1).
    pub fn matches_port(&self, name: &str, port: u32) -> bool {
        let listed = self.names.iter().any(|entry| {
            let mut fields = entry.split(':');
            let entry_name = fields.next().unwrap_or_default();
            let port_ok = match fields.next() {
                None => true,
                Some(p) => p.trim().parse::<u32>() == Ok(port),
            };
            port_ok && self.name_matches(entry_name, name)
        });
        listed != self.exclude
    }

    /// `name` against one listed name: whole with `=`, else as a prefix.
    fn name_matches(&self, listed: &str, name: &str) -> bool {
        if self.exact {
            name == listed
        } else {
            name.starts_with(listed)
        }
    }
}

/// An address family, from `NCCL_SOCKET_FAMILY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// `AF_INET` → V4, `AF_INET6` → V6; anything else is reported and ignored.
    pub fn parse(value: &str) -> Option<Family> {
        match value.trim().to_ascii_uppercase().as_str() {
            "AF_INET" => Some(Family::V4),
            "AF_INET6" => Some(Family::V6),
            _ => {
                tracing::warn!(target: "BOOTSTRAP",
                    "NCCL_SOCKET_FAMILY={value:?} is neither AF_INET nor AF_INET6; ignored");
                None
            }
        }
    }
}

/// The first usable interface of `candidates`: of `family` when given, else IPv4 first.
fn first_usable<'a>(candidates: &[&'a Interface], family: Option<Family>) -> Option<&'a Interface> {
    let of = |f: Family| candidates.iter().copied().find(|i| i.usable() && i.family() == f);
    match family {
        Some(f) => of(f),
        None => of(Family::V4).or_else(|| of(Family::V6)),
    }
}

/// Names of the candidates that are down (or not running), for the reason text.
fn down_names(candidates: &[&Interface]) -> Vec<String> {
    let mut names: Vec<String> =
        candidates.iter().filter(|i| !i.usable()).map(|i| i.name.clone()).collect();
    names.dedup();
    names
}

/// ` (skipped eth1, eth2: down)` when candidates were down, else nothing.
fn skipped_text(down: &[String]) -> String {
    if down.is_empty() {
        String::new()
    } else {
        format!(" (skipped {}: down)", down.join(", "))
    }
}

/// Every interface with its state, for error messages.
fn describe_all(ifaces: &[Interface]) -> String {
    if ifaces.is_empty() {
        return "none".to_string();
    }
    ifaces.iter().map(Interface::to_string).collect::<Vec<_>>().join(", ")
}

/// Picks the bootstrap interface from `ifaces` (see the module doc); returns it and why.
/// `spec` is the `NCCL_SOCKET_IFNAME` value, `family` what `NCCL_SOCKET_FAMILY` says.
pub fn choose(
    ifaces: &[Interface],
    spec: Option<&str>,
    family: Option<Family>,
) -> Result<(Interface, String)> {
    let of_family: Vec<&Interface> =
        ifaces.iter().filter(|i| family.map_or(true, |f| i.family() == f)).collect();
    match spec.map(str::trim).filter(|s| !s.is_empty()) {
        Some(spec) => choose_by_spec(ifaces, &of_family, spec, family),
        None => choose_default(ifaces, &of_family),
    }
}

/// With `NCCL_SOCKET_IFNAME` set: the first usable matching interface, or an error.
fn choose_by_spec(
    ifaces: &[Interface],
    of_family: &[&Interface],
    spec: &str,
    family: Option<Family>,
) -> Result<(Interface, String)> {
    let parsed = IfnameSpec::parse(spec);
    let matching: Vec<&Interface> =
        of_family.iter().copied().filter(|i| parsed.matches(&i.name)).collect();
    if let Some(chosen) = first_usable(&matching, family) {
        let reason =
            format!("matches NCCL_SOCKET_IFNAME={spec}{}", skipped_text(&down_names(&matching)));
        return Ok((chosen.clone(), reason));
    }
    let family_text = match family {
        Some(Family::V4) => " with an IPv4 address",
        Some(Family::V6) => " with an IPv6 address",
        None => "",
    };
    Err(Error::invalid_argument(format!(
        "NCCL_SOCKET_IFNAME={spec} matches no interface that is up{family_text}; interfaces seen: {}",
        describe_all(ifaces)
    )))
}

/// Without `NCCL_SOCKET_IFNAME`: anything but docker and loopback, then docker, then loopback.
fn choose_default(ifaces: &[Interface], of_family: &[&Interface]) -> Result<(Interface, String)> {
    let not_docker_or_lo = IfnameSpec::parse("^docker,lo");
    let is_docker = |i: &Interface| i.name.starts_with("docker");
    let is_loopback = |i: &Interface| i.loopback || i.name.starts_with("lo");

    let others: Vec<&Interface> = of_family
        .iter()
        .copied()
        .filter(|i| !i.loopback && not_docker_or_lo.matches(&i.name))
        .collect();
    let skipped = skipped_text(&down_names(&others));
    if let Some(chosen) = first_usable(&others, None) {
        let reason = format!("first interface that is up, not loopback and not docker*{skipped}");
        return Ok((chosen.clone(), reason));
    }
    let docker: Vec<&Interface> =
        of_family.iter().copied().filter(|i| is_docker(i) && !i.loopback).collect();
    if let Some(chosen) = first_usable(&docker, None) {
        let reason = format!("no other interface is up except docker*{skipped}");
        return Ok((chosen.clone(), reason));
    }
    let loopback: Vec<&Interface> = of_family.iter().copied().filter(|i| is_loopback(i)).collect();
    if let Some(chosen) = first_usable(&loopback, None) {
        let reason = format!("no other interface is up; using loopback{skipped}");
        return Ok((chosen.clone(), reason));
    }
    Err(Error::system(format!(
        "no network interface is up to bootstrap on; interfaces seen: {}",
        describe_all(ifaces)
    )))
}

/// The interface bootstrap uses, from `NCCL_SOCKET_IFNAME` and `NCCL_SOCKET_FAMILY` of the
/// process environment (see [`bootstrap_interface_from`]).
pub fn bootstrap_interface() -> Result<Interface> {
    bootstrap_interface_from(env_str)
}

/// The interface bootstrap uses, from `NCCL_SOCKET_IFNAME` and `NCCL_SOCKET_FAMILY` as
/// `lookup` gives them (the host passes its parameter lookup, so that an env plugin sees
/// them). The first success is logged (BOOTSTRAP) and kept for the rest of the process;
/// errors are not.
pub fn bootstrap_interface_from(lookup: impl Fn(&str) -> Option<String>) -> Result<Interface> {
    static CHOSEN: OnceLock<Interface> = OnceLock::new();
    if let Some(iface) = CHOSEN.get() {
        return Ok(iface.clone());
    }
    let spec = lookup("NCCL_SOCKET_IFNAME");
    let family = lookup("NCCL_SOCKET_FAMILY").and_then(|f| Family::parse(&f));
    let ifaces = list_interfaces()?;
    let (iface, reason) = choose(&ifaces, spec.as_deref(), family)?;
    if CHOSEN.set(iface.clone()).is_ok() {
        tracing::info!(target: "BOOTSTRAP",
            "Bootstrap: using interface {} ({}): {reason}", iface.name, iface.addr);
    }
    Ok(CHOSEN.get().cloned().unwrap_or(iface))
}

/// Parses an `NCCL_COMM_ID` value: `1.2.3.4:5000`, `[::1]:5000` or `hostname:5000` (the
/// host name resolved, its first address taken).
pub fn parse_socket_addr(s: &str) -> Result<SocketAddr> {
    parse_socket_addr_with(s, |host, port| (host, port).to_socket_addrs().map(|a| a.collect()))
}

/// [`parse_socket_addr`] with the host name resolved by `resolve` (tests and the fuzz target
/// resolve without asking DNS).
pub fn parse_socket_addr_with(
    s: &str,
    resolve: impl FnOnce(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
) -> Result<SocketAddr> {
    let value = s.trim();
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad = |why: &str| {
        Error::invalid_argument(format!("bad address {s:?} ({why}): expected host:port"))
    };
    let (host, port) = value.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port.parse().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    if host.is_empty() || host.contains(':') {
        return Err(bad("bad host"));
    }
    let resolved = resolve(host, port).map_err(|e| bad(&format!("cannot resolve {host}: {e}")))?;
    resolved.into_iter().next().ok_or_else(|| bad(&format!("{host} resolves to no address")))
}

/// Entry points for the fuzz targets in `fuzz/` and the corpus regression test: arbitrary
/// text through the parsers, panicking only if a parser breaks a promise. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// An `NCCL_COMM_ID` value, host names "resolved" to 192.0.2.1 without DNS.
    pub fn comm_id(text: &str) {
        let fake = |_: &str, port: u16| Ok(vec![SocketAddr::new(IpAddr::V4([192, 0, 2, 1].into()), port)]);
        match parse_socket_addr_with(text, fake) {
            Ok(addr) => match text.trim().parse::<SocketAddr>() {
                Ok(literal) => assert_eq!(addr, literal),
                Err(_) => {
                    let port = text.trim().rsplit_once(':').map(|(_, p)| p.parse::<u16>());
                    assert_eq!(port, Some(Ok(addr.port())), "{text:?} gave {addr}");
                }
            },
            Err(e) => assert_eq!(e.code, ResultCode::InvalidArgument, "{e}"),
        }
    }

    /// An `NCCL_SOCKET_IFNAME` value (and, after a newline, an `NCCL_SOCKET_FAMILY` one),
    /// matched against made-up interfaces and used to choose one of them.
    pub fn socket_ifname(text: &str) {
        let (spec_text, family_text) = text.split_once('\n').unwrap_or((text, ""));
        let spec = IfnameSpec::parse(spec_text);
        let family = Family::parse(family_text);
        let iface = |name: &str, addr: &str, up: bool, loopback: bool| Interface {
            name: name.into(),
            addr: addr.parse().unwrap(),
            up,
            running: up,
            loopback,
        };
        let ifaces = [
            iface("lo", "127.0.0.1", true, true),
            iface("eth0", "10.0.0.1", true, false),
            iface("eth1", "fd00::1", true, false),
            iface("ib0", "10.1.0.1", false, false),
            iface("docker0", "172.17.0.1", true, false),
        ];
        for i in &ifaces {
            let listed = spec.names.iter().any(|n| if spec.exact { &i.name == n } else { i.name.starts_with(n.as_str()) });
            assert_eq!(spec.matches(&i.name), listed != spec.exclude);
        }
        match choose(&ifaces, Some(spec_text), family) {
            Ok((chosen, reason)) => {
                assert!(chosen.usable() && !reason.is_empty(), "{chosen} {reason}");
                assert!(family.is_none_or(|f| chosen.family() == f));
                if !spec_text.trim().is_empty() {
                    assert!(spec.matches(&chosen.name), "{spec_text:?} chose {chosen}");
                }
            }
            Err(e) => assert!(!e.message.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, up: bool) -> Interface {
        let addr: IpAddr = addr.parse().unwrap();
        Interface { name: name.into(), addr, up, running: up, loopback: addr.is_loopback() }
    }

    fn chosen(
        ifaces: &[Interface],
        spec: Option<&str>,
        family: Option<Family>,
    ) -> (String, IpAddr, String) {
        let (i, reason) = choose(ifaces, spec, family).unwrap();
        (i.name, i.addr, reason)
    }

    #[test]
    fn specs_parse_prefix_exact_and_exclude() {
        let s = IfnameSpec::parse("eth, ib");
        assert_eq!(
            s,
            IfnameSpec { exclude: false, exact: false, names: vec!["eth".into(), "ib".into()] }
        );
        assert!(s.matches("eth0") && s.matches("ib1") && !s.matches("enp3s0"));

        let s = IfnameSpec::parse("=eth0");
        assert!(s.exact && !s.exclude);
        assert!(s.matches("eth0") && !s.matches("eth01") && !s.matches("eth"));

        let s = IfnameSpec::parse("^docker,lo");
        assert!(s.exclude && !s.exact);
        assert!(!s.matches("docker0") && !s.matches("lo") && s.matches("eth0"));

        let s = IfnameSpec::parse("^=eth0");
        assert!(s.exclude && s.exact);
        assert!(!s.matches("eth0") && s.matches("eth01") && s.matches("lo"));

        assert!(!IfnameSpec::parse("").matches("eth0"));
        assert!(IfnameSpec::parse("^").matches("eth0"));
    }

    #[test]
    fn specs_with_ports_select_ports() {
        let s = IfnameSpec::parse("mlx5_0:1,mlx5_1");
        assert!(s.matches_port("mlx5_0", 1) && !s.matches_port("mlx5_0", 2));
        assert!(s.matches_port("mlx5_1", 1) && s.matches_port("mlx5_1", 2));
        assert!(s.matches_port("mlx5_10", 1), "a prefix without = matches longer names");
        assert!(!s.matches_port("mlx4_0", 1));

        let s = IfnameSpec::parse("=mlx5_1:2:0:0");
        assert!(s.matches_port("mlx5_1", 2) && !s.matches_port("mlx5_1", 1));
        assert!(!s.matches_port("mlx5_10", 2));

        let s = IfnameSpec::parse("^mlx5_0:2");
        assert!(s.matches_port("mlx5_0", 1) && !s.matches_port("mlx5_0", 2));
        assert!(s.matches_port("mlx5_1", 2));

        assert!(!IfnameSpec::parse("mlx5_0:x").matches_port("mlx5_0", 1));
    }

    #[test]
    fn families_parse() {
        assert_eq!(Family::parse("AF_INET"), Some(Family::V4));
        assert_eq!(Family::parse("af_inet6"), Some(Family::V6));
        assert_eq!(Family::parse("AF_UNIX"), None);
    }

    #[test]
    fn default_skips_loopback_docker_and_down_interfaces() {
        let ifaces = [
            iface("lo", "127.0.0.1", true),
            iface("docker0", "172.17.0.1", true),
            iface("eth0", "10.0.0.1", false),
            iface("eth1", "10.0.1.1", true),
        ];
        let (name, addr, reason) = chosen(&ifaces, None, None);
        assert_eq!((name.as_str(), addr), ("eth1", "10.0.1.1".parse().unwrap()));
        assert!(reason.contains("not loopback and not docker"), "{reason}");
        assert!(reason.contains("skipped eth0: down"), "{reason}");
    }

    #[test]
    fn default_prefers_ipv4_unless_family_says_otherwise() {
        let ifaces = [iface("eth0", "2001:db8::1", true), iface("eth1", "10.0.1.1", true)];
        assert_eq!(chosen(&ifaces, None, None).0, "eth1");
        assert_eq!(chosen(&ifaces, None, Some(Family::V6)).0, "eth0");
        assert_eq!(chosen(&ifaces, None, Some(Family::V4)).0, "eth1");
    }

    #[test]
    fn interfaces_up_but_not_running_are_skipped() {
        let mut eth0 = iface("eth0", "10.0.0.1", true);
        eth0.running = false;
        let ifaces = [eth0, iface("eth1", "10.0.1.1", true)];
        let (name, _, reason) = chosen(&ifaces, Some("eth"), None);
        assert_eq!(name, "eth1");
        assert!(
            reason.contains("NCCL_SOCKET_IFNAME=eth") && reason.contains("skipped eth0"),
            "{reason}"
        );
    }

    #[test]
    fn falls_back_to_docker_then_loopback() {
        let ifaces = [iface("lo", "127.0.0.1", true), iface("eth0", "10.0.0.1", false)];
        let (name, _, reason) = chosen(&ifaces, None, None);
        assert_eq!(name, "lo");
        assert!(reason.contains("no other interface is up"), "{reason}");

        let with_docker = [ifaces[0].clone(), iface("docker0", "172.17.0.1", true)];
        assert_eq!(chosen(&with_docker, None, None).0, "docker0");

        let v6_lo = [iface("lo", "127.0.0.1", true), iface("lo", "::1", true)];
        assert_eq!(chosen(&v6_lo, None, Some(Family::V6)).1, "::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn nothing_up_is_a_system_error() {
        let e = choose(&[iface("eth0", "10.0.0.1", false)], None, None).unwrap_err();
        assert_eq!(e.code, ResultCode::SystemError);
        assert!(e.message.contains("eth0 10.0.0.1 (down)"), "{}", e.message);
        assert_eq!(choose(&[], None, None).unwrap_err().code, ResultCode::SystemError);
    }

    #[test]
    fn user_spec_picks_first_match_in_list_order() {
        let ifaces = [
            iface("lo", "127.0.0.1", true),
            iface("ib0", "192.168.0.5", true),
            iface("eth0", "10.0.0.1", true),
        ];
        assert_eq!(chosen(&ifaces, Some("eth,ib"), None).0, "ib0");
        assert_eq!(chosen(&ifaces, Some("=eth0"), None).0, "eth0");
        assert_eq!(chosen(&ifaces, Some("lo"), None).0, "lo");
        assert_eq!(chosen(&ifaces, Some("^ib,lo"), None).0, "eth0");
        assert_eq!(chosen(&ifaces, Some("^=lo"), None).0, "ib0");
    }

    #[test]
    fn user_spec_without_match_names_the_value_and_the_interfaces() {
        let ifaces = [iface("eth0", "10.0.0.1", false), iface("lo", "127.0.0.1", true)];
        let e = choose(&ifaces, Some("eth"), None).unwrap_err();
        assert_eq!(e.code, ResultCode::InvalidArgument);
        assert!(e.message.contains("NCCL_SOCKET_IFNAME=eth"), "{}", e.message);
        assert!(e.message.contains("eth0 10.0.0.1 (down)"), "{}", e.message);
        assert!(e.message.contains("lo 127.0.0.1 (up, loopback)"), "{}", e.message);

        let e = choose(&ifaces, Some("lo"), Some(Family::V6)).unwrap_err();
        assert!(e.message.contains("IPv6"), "{}", e.message);
    }

    #[test]
    fn ipv6_link_local_is_recognised() {
        assert!(is_ipv6_link_local(&"fe80::1".parse().unwrap()));
        assert!(is_ipv6_link_local(&"febf::1".parse().unwrap()));
        assert!(!is_ipv6_link_local(&"fec0::1".parse().unwrap()));
        assert!(!is_ipv6_link_local(&"10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn listing_finds_loopback_and_no_link_local() {
        let ifaces = list_interfaces().unwrap();
        assert!(ifaces.iter().any(|i| i.loopback), "{ifaces:?}");
        assert!(ifaces.iter().all(|i| !is_ipv6_link_local(&i.addr)), "{ifaces:?}");
    }

    #[test]
    fn bootstrap_interface_is_stable() {
        let first = bootstrap_interface().unwrap();
        assert!(first.up && first.running, "{first}");
        assert_eq!(bootstrap_interface().unwrap(), first);
    }

    #[test]
    fn socket_addrs_parse() {
        assert_eq!(parse_socket_addr("1.2.3.4:5000").unwrap(), "1.2.3.4:5000".parse().unwrap());
        assert_eq!(parse_socket_addr(" [::1]:5000 ").unwrap(), "[::1]:5000".parse().unwrap());
        let local = parse_socket_addr("localhost:5001").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 5001, "{local}");
        for bad in [
            "1.2.3.4",
            "host:port",
            ":5000",
            "1.2.3.4:70000",
            "::1:5000",
            "no-such-host.invalid:5000",
        ] {
            let e = parse_socket_addr(bad).unwrap_err();
            assert_eq!(e.code, ResultCode::InvalidArgument, "{bad}");
            assert!(e.message.contains(bad), "{bad}: {}", e.message);
        }
    }
}

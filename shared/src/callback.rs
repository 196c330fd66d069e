//! Which callback URLs the service will call (async mode).
//!
//! The rules against server-side request forgery: `https` only, to public
//! addresses only, checked after DNS resolution, and the connection goes to
//! the addresses that were checked: the HTTP client resolves names through
//! `delivery::CheckedResolver` and nothing else, so no second lookup can answer
//! differently (DNS rebinding). An address literal in the URL is checked
//! before the request. No redirect is followed, no proxy is used. A setting
//! ([`CallbackPolicy::allow_local`]) allows `http` and loopback addresses
//! for local use; private, link-local and metadata addresses stay refused.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::Url;

/// Longest callback URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Which callbacks the service calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallbackPolicy {
    /// Also `http`, and loopback addresses (a receiver on this machine).
    pub allow_local: bool,
}

/// Why a callback URL is not called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    NotAUrl,
    TooLong,
    Scheme,
    Credentials,
    NoHost,
    /// The host is an address that is not public.
    Address(IpAddr),
    /// The host name resolves to an address that is not public (which one
    /// is not said: the service's resolver may know names the caller's
    /// does not).
    ResolvesPrivate,
    /// The host name does not resolve.
    Unresolved,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotAUrl => f.write_str("callback url is not a URL"),
            Refusal::TooLong => write!(f, "callback url is longer than {MAX_URL_LEN} characters"),
            Refusal::Scheme => f.write_str(
                "callback url must be https (http too, when the service allows local callbacks)",
            ),
            Refusal::Credentials => f.write_str("callback url must not carry a user or password"),
            Refusal::NoHost => f.write_str("callback url has no host"),
            // The address is the caller's own input: safe to say.
            Refusal::Address(ip) => write!(
                f,
                "callback url leads to {ip}, a non-public address (loopback, private, \
                 link-local, metadata and reserved ranges are refused)"
            ),
            Refusal::ResolvesPrivate => f.write_str(
                "callback url's host resolves to a non-public address (loopback, private, \
                 link-local, metadata and reserved ranges are refused)",
            ),
            Refusal::Unresolved => f.write_str("callback url's host does not resolve"),
        }
    }
}

impl std::error::Error for Refusal {}

impl CallbackPolicy {
    /// The URL's own rules: syntax, scheme, no credentials, and an address
    /// literal host that is allowed. A host name is checked when resolved.
    pub fn check_url(&self, raw: &str) -> Result<Url, Refusal> {
        if raw.len() > MAX_URL_LEN {
            return Err(Refusal::TooLong);
        }
        let url = Url::parse(raw).map_err(|_| Refusal::NotAUrl)?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_local => {}
            _ => return Err(Refusal::Scheme),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal::Credentials);
        }
        match literal(&url) {
            Some(Ok(ip)) => self.check_ip(ip).map(|()| url),
            Some(Err(refusal)) => Err(refusal),
            None => Ok(url),
        }
    }

    /// [`check_url`](Self::check_url), then the host name's addresses: every
    /// one must be allowed (a name with one private address among public
    /// ones is refused: the connection could go to any of them).
    pub async fn check(&self, raw: &str) -> Result<Url, Refusal> {
        let url = self.check_url(raw)?;
        if literal(&url).is_none() {
            self.resolve(url.host_str().unwrap_or_default()).await?;
        }
        Ok(url)
    }

    /// Whether the service may connect to `ip`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refusal> {
        let allowed = is_public(ip) || (self.allow_local && ip.to_canonical().is_loopback());
        if allowed {
            Ok(())
        } else {
            Err(Refusal::Address(ip))
        }
    }

    /// The addresses of `name`, every one of them allowed.
    pub(crate) async fn resolve(&self, name: &str) -> Result<Vec<SocketAddr>, Refusal> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, 0))
            .await
            .map_err(|_| Refusal::Unresolved)?
            .collect();
        if addrs.is_empty() {
            return Err(Refusal::Unresolved);
        }
        if addrs.iter().any(|addr| self.check_ip(addr.ip()).is_err()) {
            return Err(Refusal::ResolvesPrivate);
        }
        Ok(addrs)
    }
}

/// The URL's host as an address literal (the URL parser has normalized
/// `0x7f.1` and `2130706433` to `127.0.0.1`); `None` for a name.
fn literal(url: &Url) -> Option<Result<IpAddr, Refusal>> {
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Some(Err(Refusal::NoHost));
    };
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().ok().map(Ok)
}

/// Whether `ip` is a public unicast address: not loopback, private (RFC
/// 1918, IPv6 unique local), link-local (the metadata address
/// 169.254.169.254 among them), shared (CGNAT), documentation, benchmarking,
/// multicast or reserved; an IPv6 address that embeds an IPv4 one
/// (mapped, NAT64, 6to4) by that IPv4 address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => is_public_v6(ip),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = a == 0 // "this network"
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224; // multicast, reserved, broadcast
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let embedded_v4 = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    match segments {
        // NAT64 (64:ff9b::/96): the IPv4 address it reaches.
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => is_public_v4(embedded_v4(high, low)),
        // 6to4 (2002::/16): the IPv4 address of its relay.
        [0x2002, high, low, ..] => is_public_v4(embedded_v4(high, low)),
        // Teredo (2001::/32) tunnels anywhere; documentation (2001:db8::/32).
        [0x2001, 0 | 0xdb8, ..] => false,
        // Only global unicast (2000::/3) is public: this refuses ::, ::1,
        // IPv4-compatible, unique local (fc00::/7), link-local (fe80::/10),
        // multicast (ff00::/8) and the discard prefix (100::/64).
        [first, ..] => first & 0xe000 == 0x2000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRICT: CallbackPolicy = CallbackPolicy { allow_local: false };
    const LOCAL: CallbackPolicy = CallbackPolicy { allow_local: true };

    #[test]
    fn only_public_addresses_are_called() {
        let refused = [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.0.1",
            "100.64.0.1",
            "100.127.255.254",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.19.255.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "2001::1",
            "2001:db8::1",
            "fc00::1",
            "fd00:ec2::254",
            "fdff:ffff::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "100::1",
        ];
        for ip in refused {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(!is_public(ip), "{ip} must be refused");
            assert_eq!(STRICT.check_ip(ip), Err(Refusal::Address(ip)));
        }
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "198.17.0.1",
            "198.20.0.1",
            "223.255.255.254",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for ip in public {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(is_public(ip), "{ip} is public");
            assert_eq!(STRICT.check_ip(ip), Ok(()));
        }
    }

    #[test]
    fn the_local_setting_allows_loopback_and_nothing_else_private() {
        for ip in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(LOCAL.check_ip(ip.parse().unwrap()), Ok(()), "{ip}");
        }
        for ip in ["10.0.0.1", "169.254.169.254", "fc00::1", "192.168.0.1"] {
            assert!(LOCAL.check_ip(ip.parse().unwrap()).is_err(), "{ip}");
        }
    }

    #[test]
    fn urls_are_checked_before_any_lookup() {
        let cases = [
            ("not a url", Refusal::NotAUrl),
            ("/relative", Refusal::NotAUrl),
            ("http://8.8.8.8/hook", Refusal::Scheme),
            ("ftp://8.8.8.8/hook", Refusal::Scheme),
            ("file:///etc/passwd", Refusal::Scheme),
            ("https://user:pw@8.8.8.8/hook", Refusal::Credentials),
            ("https://user@8.8.8.8/hook", Refusal::Credentials),
            (
                "https://127.0.0.1/hook",
                Refusal::Address("127.0.0.1".parse().unwrap()),
            ),
            (
                "https://[::1]:8443/hook",
                Refusal::Address("::1".parse().unwrap()),
            ),
            (
                "https://169.254.169.254/latest/meta-data",
                Refusal::Address("169.254.169.254".parse().unwrap()),
            ),
            (
                "https://[fc00::1]/",
                Refusal::Address("fc00::1".parse().unwrap()),
            ),
            (
                "https://10.1.2.3/",
                Refusal::Address("10.1.2.3".parse().unwrap()),
            ),
            // Other spellings of loopback that URL parsers normalize.
            (
                "https://2130706433/",
                Refusal::Address("127.0.0.1".parse().unwrap()),
            ),
            (
                "https://0x7f.1/",
                Refusal::Address("127.0.0.1".parse().unwrap()),
            ),
        ];
        for (url, refusal) in cases {
            assert_eq!(STRICT.check_url(url), Err(refusal), "{url}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(STRICT.check_url(&long), Err(Refusal::TooLong));
        assert!(STRICT.check_url("https://8.8.8.8/hook").is_ok());
        assert!(STRICT.check_url("https://example.com:8443/a?b=c").is_ok());
        assert!(LOCAL.check_url("http://127.0.0.1:9000/hook").is_ok());
        assert!(LOCAL.check_url("http://[::1]:9000/hook").is_ok());
        assert!(LOCAL.check_url("http://10.0.0.1/hook").is_err());
    }

    #[tokio::test]
    async fn names_are_checked_by_what_they_resolve_to() {
        // `localhost` resolves to loopback on every machine (no network needed).
        assert_eq!(
            STRICT.check("https://localhost/hook").await,
            Err(Refusal::ResolvesPrivate)
        );
        assert!(LOCAL.check("http://localhost:9/hook").await.is_ok());
        assert_eq!(
            STRICT.check("https://no-such-host.invalid/hook").await,
            Err(Refusal::Unresolved)
        );
    }
}

//! `--cors-origin`: lets a browser page on that origin call the API, as the
//! template's `CorsAllowOrigin` lets it call the deployed one (API Gateway
//! answers the preflight there; here, this does). Off by default.

use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, StatusCode};

/// The methods and request headers the API uses.
pub const ALLOW_METHODS: &str = "GET, HEAD, PUT, POST, DELETE";
pub const ALLOW_HEADERS: &str = "content-type";
/// Seconds a browser may cache a preflight's answer.
pub const MAX_AGE: &str = "600";

/// The origin allowed (`*` or one `scheme://host[:port]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cors {
    origin: HeaderValue,
}

impl Cors {
    /// Parses `--cors-origin`: `*`, or an origin without a path.
    pub fn parse(origin: &str) -> Result<Cors, String> {
        let well_formed = origin == "*"
            || ((origin.starts_with("http://") || origin.starts_with("https://"))
                && !origin.trim_end_matches('/').contains(['?', '#'])
                && origin.splitn(4, '/').nth(3).is_none_or(str::is_empty));
        let origin = origin.trim_end_matches('/');
        match HeaderValue::from_str(origin) {
            Ok(origin) if well_formed => Ok(Cors { origin }),
            _ => Err(format!(
                "{origin:?} is not an origin: give * or scheme://host[:port], like https://app.example.com"
            )),
        }
    }

    /// A preflight (`OPTIONS` with `Access-Control-Request-Method`) is
    /// answered here, before routing: 204 and what the API allows.
    pub fn preflight(
        &self,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<(StatusCode, HeaderMap)> {
        if method != Method::OPTIONS || !headers.contains_key("access-control-request-method") {
            return None;
        }
        let mut answer = HeaderMap::new();
        self.allow(&mut answer);
        let set = |answer: &mut HeaderMap, name: &'static str, value: &'static str| {
            answer.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        };
        set(&mut answer, "access-control-allow-methods", ALLOW_METHODS);
        set(&mut answer, "access-control-allow-headers", ALLOW_HEADERS);
        set(&mut answer, "access-control-max-age", MAX_AGE);
        Some((StatusCode::NO_CONTENT, answer))
    }

    /// Adds the allowed origin to an answer.
    pub fn allow(&self, headers: &mut HeaderMap) {
        headers.insert("access-control-allow-origin", self.origin.clone());
        if self.origin != "*" {
            // The answer depends on the caller's origin: caches must know.
            headers.insert("vary", HeaderValue::from_static("origin"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_star_or_scheme_host_port() {
        for good in [
            "*",
            "https://app.example.com",
            "http://127.0.0.1:5173",
            "https://a.b/",
        ] {
            assert!(Cors::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "app.example.com",
            "https://a.b/path",
            "ftp://a.b",
            "https://a.b?x",
            "",
        ] {
            assert!(Cors::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_real_preflight_is_answered() {
        let cors = Cors::parse("https://app.example.com").expect("origin");
        let mut asking = HeaderMap::new();
        asking.insert(
            "access-control-request-method",
            HeaderValue::from_static("POST"),
        );
        let (status, headers) = cors
            .preflight(&Method::OPTIONS, &asking)
            .expect("preflight");
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert_eq!(
            headers["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert_eq!(headers["access-control-allow-methods"], ALLOW_METHODS);
        assert_eq!(headers["vary"], "origin");
        assert!(cors
            .preflight(&Method::OPTIONS, &HeaderMap::new())
            .is_none());
        assert!(cors.preflight(&Method::GET, &asking).is_none());
    }
}

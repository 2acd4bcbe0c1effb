//! Whether a request passes the checks before a handler (`gateway/checks.py`: one Host, no
//! Content-Encoding, the Host allowed, a valid API key, a JSON Content-Type). Only the yes is
//! decided here: a request that fails any is handed over, and the Python front refuses it with
//! its own status and message (the rules are written once, there; this is their admission).

use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HOST};

/// The hosts and keys in force (keys change on SIGHUP: `Gateway.set_api_keys`).
#[derive(Debug, Default, Clone)]
pub struct Admission {
    /// Host header values served, lower case, without port; empty: any
    pub hosts: Vec<String>,
    /// `Authorization: Bearer <key>` values accepted; empty: no authentication
    pub keys: Vec<Vec<u8>>,
}

impl Admission {
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let mut hosts = headers.get_all(HOST).iter();
        let host = hosts.next();
        if hosts.next().is_some() {
            return false;
        }
        if headers
            .get(CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"))
        {
            return false;
        }
        if !self.hosts.is_empty() {
            let host = host.map(|h| host_name(h.as_bytes())).unwrap_or_default();
            if !self.hosts.contains(&host) {
                return false;
            }
        }
        if !self.keys.is_empty() && !self.key_matches(headers) {
            return false;
        }
        headers.get(CONTENT_TYPE).is_some_and(|v| {
            let media = v.as_bytes().split(|&c| c == b';').next().unwrap_or(b"");
            let media = media.trim_ascii().to_ascii_lowercase();
            media == b"application/json" || media.ends_with(b"+json")
        })
    }

    /// NOTE: compared with every key in full, whatever matched, as the Python check does: the
    /// time taken says nothing about how close a key was.
    fn key_matches(&self, headers: &HeaderMap) -> bool {
        let value = headers
            .get(AUTHORIZATION)
            .map_or(&b""[..], |v| v.as_bytes());
        let (scheme, sent) = match value.iter().position(|&c| c == b' ') {
            Some(i) => (&value[..i], value[i + 1..].trim_ascii()),
            None => (value, &b""[..]),
        };
        if !scheme.eq_ignore_ascii_case(b"bearer") {
            return false;
        }
        let mut matched = false;
        for key in &self.keys {
            matched |= same(sent, key);
        }
        matched
    }
}

fn same(a: &[u8], b: &[u8]) -> bool {
    let mut differ = a.len() ^ b.len();
    for (x, y) in a.iter().zip(b.iter()) {
        differ |= (x ^ y) as usize;
    }
    differ == 0
}

/// The Host header's name, as `checks.check_host` reads it: lower case, brackets of an IPv6
/// address and a port dropped.
fn host_name(value: &[u8]) -> String {
    let host = String::from_utf8_lossy(value).trim().to_lowercase();
    if host.starts_with('[') {
        if let Some(end) = host.find(']') {
            return host[1..end].to_string();
        }
    }
    if host.matches(':').count() == 1 {
        return host
            .rsplit_once(':')
            .map_or(host.clone(), |(h, _)| h.to_string());
    }
    host
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_plain_json_request_is_admitted() {
        let open = Admission::default();
        assert!(open.admits(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(open.admits(&headers(&[("content-type", "application/vnd.x+json")])));
        assert!(!open.admits(&headers(&[])));
        assert!(!open.admits(&headers(&[("content-type", "text/plain")])));
        let zipped = [
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ];
        assert!(!open.admits(&headers(&zipped)));
        let two = [
            ("content-type", "application/json"),
            ("host", "a"),
            ("host", "b"),
        ];
        assert!(!open.admits(&headers(&two)));
    }

    #[test]
    fn hosts_and_keys_are_checked_as_the_python_front_does() {
        let closed = Admission {
            hosts: vec!["localhost".into(), "::1".into()],
            keys: vec![b"k1".to_vec(), b"key-two".to_vec()],
        };
        let json = ("content-type", "application/json");
        let ok = [
            json,
            ("host", "LocalHost:8080"),
            ("authorization", "bearer key-two"),
        ];
        assert!(closed.admits(&headers(&ok)));
        let v6 = [json, ("host", "[::1]:80"), ("authorization", "Bearer k1")];
        assert!(closed.admits(&headers(&v6)));
        let bad_key = [json, ("host", "localhost"), ("authorization", "Bearer k2")];
        assert!(!closed.admits(&headers(&bad_key)));
        let no_key = [json, ("host", "localhost")];
        assert!(!closed.admits(&headers(&no_key)));
        let other_host = [
            json,
            ("host", "evil.example"),
            ("authorization", "Bearer k1"),
        ];
        assert!(!closed.admits(&headers(&other_host)));
        let basic = [json, ("host", "localhost"), ("authorization", "Basic k1")];
        assert!(!closed.admits(&headers(&basic)));
    }
}

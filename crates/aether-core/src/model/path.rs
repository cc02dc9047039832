//! Paths and escapes as the Gateway API's matches read them: path prefixes by whole elements,
//! and `%XX` decoding of query names and values. Shared by route matching
//! ([`crate::model::route_match`]) and the filters that rewrite a matched prefix
//! ([`crate::model::filters`]).

use crate::prelude::*;

use std::borrow::Cow;

/// A path prefix as a sequence of path elements: the prefix without trailing `/`
/// (`""` for `/`).
pub(crate) fn prefix_element(prefix: &str) -> &str {
    prefix.trim_end_matches('/')
}

/// Whether `path` starts with the path elements of `element` (a prefix passed through
/// [`prefix_element`]).
///
/// The prefix `/` (element `""`) matches every request, as the Gateway API says, even one
/// whose target is not a path (`OPTIONS *`).
pub(crate) fn prefix_matches(path: &str, element: &str) -> bool {
    if element.is_empty() {
        return true;
    }
    match path.strip_prefix(element) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Decodes `%XX` escapes; a malformed escape is kept as written, and bytes that do not form
/// UTF-8 are replaced (`U+FFFD`). `+` is not a space here (RFC 3986 query, not forms).
pub(crate) fn percent_decode(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).and_then(|b| hex_value(*b)),
                bytes.get(i + 2).and_then(|b| hex_value(*b)),
            )
        {
            out.push(hi << 4 | lo);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

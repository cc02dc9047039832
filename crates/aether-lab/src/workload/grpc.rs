//! The wire schema shared by the gRPC echo ([`super::echo`]) and the probe's gRPC client
//! ([`super::probe`]), issue #7 §2.
//!
//! The messages are written by hand with `#[derive(prost::Message)]`, because protoc is not
//! available in CI and the schema is three small messages. This is the `.proto` they encode
//! (field numbers are the contract; keep them when adding fields):
//!
//! ```proto
//! syntax = "proto3";
//! package aether.echo.v1;
//!
//! // The echo answers EVERY method path with this unary call, whatever the service and
//! // method names, so that GRPCRoute method matching can be tested with any names.
//! service Echo { rpc Echo(EchoRequest) returns (EchoReply); }
//!
//! message EchoRequest {
//!   string message = 1;         // echoed back in EchoReply.message
//!   int32 status_code = 2;      // non-zero: answer this gRPC status instead of a reply
//!   string status_message = 3;  // the grpc-message of that status
//! }
//!
//! message EchoReply {
//!   string ident = 1;                     // "<workload>:<port>", the identity legs check
//!   string pod = 2;                       // the pod's name
//!   string namespace = 3;                 // the pod's namespace
//!   uint32 port = 4;                      // the port the echo accepted on
//!   string authority = 5;                 // :authority as received ("" without one)
//!   string method = 6;                    // the path, "/<pkg.Service>/<Method>"
//!   repeated MetadataEntry metadata = 7;  // every request header, one entry per value
//!   string message = 8;                   // EchoRequest.message
//!   string peer = 9;                      // the source IP of the connection
//! }
//!
//! message MetadataEntry {
//!   string name = 1;   // lower case
//!   string value = 2;  // as received (a -bin value stays base64)
//! }
//! ```
//!
//! Layer 2 support code: plain data, no IO.

use serde::Serialize;

/// The method the probe calls unless told otherwise (`aether probe --grpc`).
pub const DEFAULT_METHOD: &str = "aether.echo.v1.Echo/Echo";
/// The request metadata key that asks the echo for a status: `<code>` (a number, 0-16).
pub const STATUS_HEADER: &str = "x-echo-grpc-status";
/// The request metadata key that gives the message of the status asked with [`STATUS_HEADER`].
pub const MESSAGE_HEADER: &str = "x-echo-grpc-message";
/// The response metadata key (headers, or trailers-only headers of an error) that carries the
/// echo's identity string `<workload>:<port>`.
pub const IDENT_HEADER: &str = "x-echo-ident";

/// What the probe sends (`aether.echo.v1.EchoRequest`).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct EchoRequest {
    /// Text echoed back in [`EchoReply::message`].
    #[prost(string, tag = "1")]
    pub message: String,
    /// A gRPC status code to answer instead of a reply; 0 answers the reply.
    #[prost(int32, tag = "2")]
    pub status_code: i32,
    /// The message of that status.
    #[prost(string, tag = "3")]
    pub status_message: String,
}

/// What the echo answers (`aether.echo.v1.EchoReply`).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct EchoReply {
    /// `<workload>:<port>`.
    #[prost(string, tag = "1")]
    pub ident: String,
    /// The pod's name.
    #[prost(string, tag = "2")]
    pub pod: String,
    /// The pod's namespace.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// The port the echo accepted the connection on.
    #[prost(uint32, tag = "4")]
    pub port: u32,
    /// The `:authority` as received (empty without one).
    #[prost(string, tag = "5")]
    pub authority: String,
    /// The method path, `/<pkg.Service>/<Method>`.
    #[prost(string, tag = "6")]
    pub method: String,
    /// Every request header (HTTP/2 pseudo headers aside), one entry per value, in order.
    #[prost(message, repeated, tag = "7")]
    pub metadata: Vec<MetadataEntry>,
    /// The request's [`EchoRequest::message`].
    #[prost(string, tag = "8")]
    pub message: String,
    /// The source IP of the connection.
    #[prost(string, tag = "9")]
    pub peer: String,
}

impl EchoReply {
    /// Every value of the request metadata `name` (case-insensitive), in order.
    pub fn metadata_all(&self, name: &str) -> Vec<&str> {
        self.metadata
            .iter()
            .filter(|m| m.name.eq_ignore_ascii_case(name))
            .map(|m| m.value.as_str())
            .collect()
    }
}

/// One request metadata value (`aether.echo.v1.MetadataEntry`).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub struct MetadataEntry {
    /// The name, lower case.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The value as received.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The canonical name of a gRPC status code (`NOT_FOUND`), or `CODE_<n>` for one outside 0-16.
pub fn code_name(code: i32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("CODE_{code}"), |n| (*n).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_request_encodes_with_the_documented_field_numbers() {
        let req = EchoRequest {
            message: "a".to_owned(),
            status_code: 5,
            status_message: "b".to_owned(),
        };
        // tag 1 (LEN) "a", tag 2 (VARINT) 5, tag 3 (LEN) "b".
        assert_eq!(req.encode_to_vec(), [0x0a, 1, b'a', 0x10, 5, 0x1a, 1, b'b']);
    }

    #[test]
    fn code_names_are_the_canonical_ones() {
        assert_eq!(code_name(0), "OK");
        assert_eq!(code_name(5), "NOT_FOUND");
        assert_eq!(code_name(16), "UNAUTHENTICATED");
        assert_eq!(code_name(17), "CODE_17");
        assert_eq!(code_name(-1), "CODE_-1");
    }
}

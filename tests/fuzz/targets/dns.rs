//! `dns`: the mesh DNS server's decision on one message (src/dns/server.rs `handle`), against
//! the table of the acceptance fixture (mesh names and, as in file mode, Kubernetes names).
//!
//! Properties, beyond "no panic":
//! - every reply (an answer from the table, FORMERR, NOTIMP) parses as a DNS message, is a
//!   response, and carries the query's id;
//! - an answer from the table repeats the query's one question;
//! - a message that parses as a query is never dropped silently: it is answered, refused or
//!   forwarded; only unreadable bytes and responses are dropped;
//! - a forwarded message is a query with one question (the server relays its bytes unchanged).

use aether::dns::server::{Handled, handle};
use hickory_proto::op::{Message, MessageType};

use crate::engine::Target;
use crate::{fixture, outcome};

pub(crate) const TARGET: Target = Target {
    name: "dns",
    max_len: 4096,
    dict: &[
        b"\x00\x01\x00\x01",
        b"\x00\x1c\x00\x01",
        b"\x00\xff\x00\x01",
        b"\x00\x01\x00\x03",
        b"\x00\x29\x10\x00\x00\x00\x00\x00\x00\x00",
        b"\x08mp-multi\x02mp\x06aether\x08internal\x00",
        b"\x03svc\x07cluster\x05local\x00",
        b"\xc0\x0c",
        b"\xc0\x00",
        b"\x3f",
        b"\x40",
        b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00",
        b"\x81\x80",
        b"\x00\x00\x00\x00\x00\x00",
    ],
    run,
};

fn run(input: &[u8]) -> u64 {
    let fx = fixture::get();
    let parsed = Message::from_vec(input).ok();
    let handled = handle(&fx.dns, input);
    let reply = match &handled {
        Handled::Answer(bytes) | Handled::Refuse(bytes) => Some(bytes),
        Handled::Forward(query) => {
            assert_eq!(query.metadata.message_type, MessageType::Query);
            assert_eq!(query.queries.len(), 1, "forwarded: {query:?}");
            None
        }
        Handled::Drop => {
            if let Some(m) = &parsed {
                assert_eq!(
                    m.metadata.message_type,
                    MessageType::Response,
                    "a query dropped without an answer: {m:?}"
                );
            }
            None
        }
    };
    let mut sig = handled_kind(&handled).to_owned();
    if let Some(bytes) = reply {
        let message = Message::from_vec(bytes)
            .unwrap_or_else(|e| panic!("the reply does not parse ({e}): {bytes:02x?}"));
        assert_eq!(message.metadata.message_type, MessageType::Response);
        assert_eq!(
            &bytes[..2],
            &input[..2],
            "the reply's id is not the query's"
        );
        if let (Handled::Answer(_), Some(query)) = (&handled, &parsed) {
            assert_eq!(message.queries, query.queries, "the answer's question");
        }
        sig.push_str(&format!(
            " {:?} {} {}",
            message.metadata.response_code,
            message.answers.len(),
            message.edns.is_some()
        ));
    }
    outcome(&sig)
}

fn handled_kind(h: &Handled) -> &'static str {
    match h {
        Handled::Answer(_) => "answer",
        Handled::Refuse(_) => "refuse",
        Handled::Forward(_) => "forward",
        Handled::Drop => "drop",
    }
}

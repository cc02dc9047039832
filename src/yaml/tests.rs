use serde_json::{Value, json};

use super::*;

#[test]
fn documents_keep_their_index_empty_ones_included() {
    let text = "# a comment before the first marker\n---\na: 1\n---\n# only a comment\n---\nb: 2\n...\n# after the end\n---\nc: 3\n---\n";
    let (docs, error) = documents_of(text);
    assert_eq!(error, None);
    assert_eq!(
        docs,
        vec![
            json!({"a": 1}),
            Value::Null,
            json!({"b": 2}),
            json!({"c": 3}),
            Value::Null
        ]
    );
}

#[test]
fn a_bare_document_and_directives_belong_to_the_marker_after_them() {
    assert_eq!(documents("a: 1\n"), vec!["a: 1\n"]);
    assert_eq!(
        documents("%YAML 1.2\n---\na: 1\n"),
        vec!["%YAML 1.2\n---\na: 1\n"]
    );
    assert_eq!(documents("\u{feff}--- {a: 1}\n"), vec!["--- {a: 1}\n"]);
    // `----` and `---x` are content, not markers.
    assert_eq!(documents("a: |\n  x\n----\n"), vec!["a: |\n  x\n----\n"]);
    assert_eq!(documents(""), Vec::<&str>::new());
    assert_eq!(documents("# nothing\n"), Vec::<&str>::new());
}

#[test]
fn the_first_document_that_does_not_parse_is_named_and_ends_the_read() {
    let (docs, error) = documents_of("a: 1\n---\nb: [1\n---\nc: 3\n");
    assert_eq!(docs, vec![json!({"a": 1})]);
    let (index, error) = error.expect("the second document is broken");
    assert_eq!(index, 2);
    assert!(matches!(error, YamlError::Invalid(_)), "{error:?}");
}

#[test]
fn the_core_schema_of_yaml_1_2_and_no_key_twice() {
    let (docs, error) = documents_of("a: yes\nb: off\nc: true\nd: 10\ne: ~\n");
    assert_eq!(error, None);
    assert_eq!(
        docs,
        vec![json!({"a": "yes", "b": "off", "c": true, "d": 10, "e": null})]
    );
    let (_, error) = documents_of("a: 1\na: 2\n");
    assert!(
        matches!(error, Some((1, YamlError::Invalid(_)))),
        "{error:?}"
    );
}

#[test]
fn deep_nesting_is_refused_at_once() {
    // The file of issue #36: 200 KB of nested `[`, which cost serde_yaml 6-10 s of CPU.
    for text in [
        "[".repeat(200_000),
        "{a: ".repeat(50_000),
        "- ".repeat(100_000),
    ] {
        let before = crate::test_util::thread_cpu_micros();
        let (docs, error) = documents_of(&text);
        let spent = crate::test_util::thread_cpu_micros() - before;
        assert!(docs.is_empty());
        assert_eq!(
            error,
            Some((1, YamlError::TooDeep { limit: MAX_DEPTH })),
            "{}",
            &text[..8]
        );
        // The bound of the issue: 100 ms of CPU (it takes well under one here).
        assert!(spent < 100_000, "{spent} µs of CPU to refuse it");
    }
    // Exactly at the bound is read.
    let at_bound = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(documents_of(&at_bound).1, None);
    let past = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert_eq!(
        documents_of(&past).1,
        Some((1, YamlError::TooDeep { limit: MAX_DEPTH }))
    );
}

#[test]
fn a_text_over_the_size_bound_is_not_parsed() {
    let text = "#".repeat(MAX_BYTES + 1);
    assert_eq!(
        documents_of(&text).1,
        Some((
            1,
            YamlError::TooLarge {
                bytes: MAX_BYTES + 1,
                limit: MAX_BYTES
            }
        ))
    );
    assert_eq!(
        from_str::<Value>(&text),
        Err(YamlError::TooLarge {
            bytes: MAX_BYTES + 1,
            limit: MAX_BYTES
        })
    );
}

#[test]
fn what_is_written_reads_back() {
    let value = json!({"name": "a", "ports": [80, 8080], "on": "yes", "nested": {"x": null}});
    let text = to_string(&value).expect("serializes");
    assert_eq!(from_str::<Value>(&text), Ok(value));
}

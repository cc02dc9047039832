//! Conversion tests against object shapes as `kubectl get -o yaml` prints them.

use super::*;

#[test]
fn gateway_durations_convert_to_milliseconds() {
    assert_eq!(parse_duration_ms("10s"), Some(10_000));
    assert_eq!(parse_duration_ms("500ms"), Some(500));
    assert_eq!(parse_duration_ms("1h2m"), Some(3_720_000));
    assert_eq!(parse_duration_ms("1m30s250ms"), Some(90_250));
    assert_eq!(parse_duration_ms("0s"), Some(0));
    for bad in [
        "",
        "10",
        "1.5s",
        "-1s",
        "10us",
        "123456s",
        "1h1m1s1ms1h",
        "s",
        "10 s",
    ] {
        assert_eq!(parse_duration_ms(bad), None, "{bad:?}");
    }
}

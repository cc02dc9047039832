//! Unit tests of the endpoint choice: the two choices, ejection and its end, the table's cap.

use super::*;

fn key(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, u8::try_from(i).unwrap() + 1], 8080))
}

#[test]
fn two_choices_prefer_the_endpoint_with_less_in_flight() {
    let b = Balancer::default();
    let limits = Limits::default();
    let now = Instant::now();
    // Endpoint 0 carries ten requests; with two endpoints both are always drawn.
    let busy: Vec<Chosen> = std::iter::repeat_with(|| b.choose(1, key, None, &limits, now))
        .take(10)
        .map(Option::unwrap)
        .collect();
    for _ in 0..100 {
        let c = b.choose(2, key, None, &limits, now).unwrap();
        assert_eq!(c.index, 1, "the idle endpoint wins every time");
    }
    drop(busy);
    // Load given back: the two are even again, and each wins sometimes.
    let picks: std::collections::BTreeSet<usize> = (0..200)
        .map(|_| b.choose(2, key, None, &limits, now).unwrap().index)
        .collect();
    assert_eq!(picks.len(), 2, "{picks:?}");
}

#[test]
fn an_endpoint_is_never_chosen_twice_when_avoided_and_a_single_one_is_always_chosen() {
    let b = Balancer::default();
    let limits = Limits::default();
    let now = Instant::now();
    for _ in 0..100 {
        let c = b.choose(3, key, Some(1), &limits, now).unwrap();
        assert_ne!(c.index, 1);
    }
    assert_eq!(b.choose(1, key, None, &limits, now).unwrap().index, 0);
    assert!(b.choose(1, key, Some(0), &limits, now).is_none());
    assert!(b.choose(0, key, None, &limits, now).is_none());
}

#[test]
fn a_failed_connect_ejects_but_never_the_last_endpoint_in_the_choice() {
    let b = Balancer::default();
    let limits = Limits::default();
    let now = Instant::now();
    let first = Chosen {
        index: 0,
        load: Load::new(b.state(key(0), &limits, b.ms(now))),
    };
    assert!(b.failed(&first, 2, key, &limits, now));
    assert_eq!(b.counters.ejections.get(), 1);
    for _ in 0..100 {
        assert_eq!(b.choose(2, key, None, &limits, now).unwrap().index, 1);
    }
    // The other one fails too: it is the last in the choice, so it stays.
    let second = b.choose(2, key, None, &limits, now).unwrap();
    assert!(!b.failed(&second, 2, key, &limits, now));
    assert_eq!(b.counters.ejections.get(), 1);
    // A pod-IP dial's single endpoint is never ejected.
    let only = b.choose(1, key, None, &limits, now).unwrap();
    assert!(!b.failed(&only, 1, key, &limits, now));
}

#[test]
fn a_backend_whose_endpoints_are_all_out_is_still_chosen_among() {
    let b = Balancer::default();
    let limits = Limits::default();
    let now = Instant::now();
    // Ejected through other backends: {0, 2} and {1, 2}.
    for i in [0, 1] {
        let c = Chosen {
            index: i,
            load: Load::new(b.state(key(i), &limits, b.ms(now))),
        };
        assert!(b.failed(&c, 3, key, &limits, now));
    }
    let c = b.choose(2, key, None, &limits, now).unwrap();
    assert!(c.index < 2);
}

#[tokio::test(start_paused = true)]
async fn an_ejected_endpoint_returns_when_its_time_passes_and_repeats_last_longer() {
    let b = Balancer::default();
    let limits = Limits {
        ejection: Duration::from_secs(5),
        ejection_max: Duration::from_secs(12),
        max_states: 16,
    };
    let eject = |b: &Balancer| {
        let c = Chosen {
            index: 0,
            load: Load::new(b.state(key(0), &limits, b.ms(Instant::now()))),
        };
        assert!(b.failed(&c, 2, key, &limits, Instant::now()));
    };
    let chosen_zero = |b: &Balancer| {
        (0..100).any(|_| {
            b.choose(2, key, None, &limits, Instant::now())
                .unwrap()
                .index
                == 0
        })
    };
    eject(&b);
    tokio::time::advance(Duration::from_millis(4900)).await;
    assert!(!chosen_zero(&b), "still out before 5 s");
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(chosen_zero(&b), "back after 5 s");
    assert_eq!(b.counters.returns.get(), 1);
    // The second ejection in a row lasts 10 s, the third 12 s (the cap).
    eject(&b);
    tokio::time::advance(Duration::from_millis(9900)).await;
    assert!(!chosen_zero(&b), "out for 10 s");
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(chosen_zero(&b));
    eject(&b);
    tokio::time::advance(Duration::from_millis(12_100)).await;
    assert!(chosen_zero(&b), "the cap holds");
    // A successful connect resets the doubling and brings it back at once.
    eject(&b);
    let c = Chosen {
        index: 0,
        load: Load::new(b.state(key(0), &limits, b.ms(Instant::now()))),
    };
    b.connected(&c);
    drop(c);
    assert!(chosen_zero(&b));
    assert_eq!(b.counters.ejections.get(), 4);
    assert_eq!(b.counters.returns.get(), 4);
}

#[tokio::test(start_paused = true)]
async fn the_table_is_capped_and_idle_entries_are_removed() {
    let b = Balancer::default();
    let limits = Limits {
        max_states: 4,
        ..Limits::default()
    };
    let held: Vec<Chosen> = (0..4)
        .map(|i| {
            b.choose(1, |_| key(i), None, &limits, Instant::now())
                .unwrap()
        })
        .collect();
    assert_eq!(b.tracked(), 4);
    // A fifth endpoint is chosen all the same, untracked and counted.
    let fifth = b
        .choose(1, |_| key(4), None, &limits, Instant::now())
        .unwrap();
    assert!(fifth.load.0.is_none());
    assert_eq!(b.counters.untracked.get(), 1);
    drop(held);
    tokio::time::advance(IDLE + Duration::from_secs(1)).await;
    let sixth = b
        .choose(1, |_| key(5), None, &limits, Instant::now())
        .unwrap();
    assert!(sixth.load.0.is_some(), "idle entries were swept");
    assert_eq!(b.tracked(), 1);
}

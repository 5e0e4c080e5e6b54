//! `Stage::charge`: a request admitted at its known size and charged what
//! it turned out to move (a key-value read). The bytes go to the bucket
//! without waiting, later requests wait for them, and the counters add the
//! bytes without another operation.

use std::time::{Duration, Instant};

use kv_stage::{Context, DrlSpec, ObjectSpec, QosSpec, RequestType, Rule, Stage};

fn stage_with(spec: ObjectSpec) -> Stage {
    let stage = Stage::new("charge");
    stage
        .apply_rules([Rule::CreateObject { channel: "default".into(), object: "o".into(), spec, matches: None }])
        .unwrap();
    stage
}

fn get(size: u64) -> Context {
    Context::new(RequestType::Get, size)
}

#[test]
fn a_charge_puts_a_bytes_limiter_in_debt_and_the_next_request_waits_for_it() {
    // 100 KiB/s, a burst of 1 KiB.
    let stage = stage_with(ObjectSpec::Drl(DrlSpec {
        rate: "100KiB/s".parse().unwrap(),
        burst: Some("1KiB".parse().unwrap()),
        refill_period: None,
    }));
    let t = Instant::now();
    stage.enforce(&get(4)).unwrap();
    assert!(t.elapsed() < Duration::from_millis(50), "the first read waited {:?}", t.elapsed());
    stage.charge(&get(4), 40 << 10);
    // The charge itself does not wait.
    assert!(t.elapsed() < Duration::from_millis(50), "the charge waited {:?}", t.elapsed());
    stage.enforce(&get(4)).unwrap();
    let waited = t.elapsed();
    eprintln!("the read after a 40 KiB charge at 100 KiB/s went after {waited:?}");
    // 40 KiB at 100 KiB/s, less the 1 KiB burst: about 390 ms.
    assert!(waited >= Duration::from_millis(300), "the next read did not wait for the charge: {waited:?}");
    let c = stage.collect();
    let ch = c.channel("default").unwrap();
    assert_eq!((ch.ops, ch.bytes), (2, 4 + (40 << 10) + 4));
    let o = c.object("default", "o").unwrap();
    assert_eq!((o.counter.ops, o.counter.bytes), (2, 4 + (40 << 10) + 4));
}

#[test]
fn an_ops_limiter_is_not_charged_bytes_and_a_qos_object_charges_its_read_bandwidth() {
    let ops = stage_with(ObjectSpec::Drl(DrlSpec::new("1000ops/s".parse().unwrap())));
    ops.enforce(&get(1)).unwrap();
    ops.charge(&get(1), 10 << 20);
    let t = Instant::now();
    ops.enforce(&get(1)).unwrap();
    assert!(t.elapsed() < Duration::from_millis(100), "an ops limiter waited for bytes: {:?}", t.elapsed());
    assert_eq!(ops.collect().channel("default").unwrap().bytes, 2 + (10 << 20));

    let qos = stage_with(ObjectSpec::Qos(QosSpec { limits: "rbps=100KiB".parse().unwrap(), refill_period: None }));
    qos.enforce(&get(1)).unwrap();
    qos.charge(&get(1), 30 << 10);
    let t = Instant::now();
    qos.enforce(&get(1)).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200), "a QoS read did not wait for the charge: {:?}", t.elapsed());
}

#[test]
fn a_charge_on_a_shut_down_stage_or_of_nothing_changes_nothing() {
    let stage = stage_with(ObjectSpec::Drl(DrlSpec::new("1KiB/s".parse().unwrap())));
    stage.enforce(&get(1)).unwrap();
    stage.charge(&get(1), 0);
    stage.shutdown();
    stage.charge(&get(1), 1 << 20);
    let ch = stage.collect().channel("default").unwrap();
    assert_eq!((ch.ops, ch.bytes), (1, 1));
}

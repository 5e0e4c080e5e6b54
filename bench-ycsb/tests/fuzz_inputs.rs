//! What a user hands bench-ycsb, under mutated input: YCSB property files,
//! `--profile` specs and schedules, `--device` specs and `--systems`
//! lists. Each case starts from a real input (YCSB's core workload A, the
//! named profiles, a kernel device) with random edits (bytes deleted,
//! inserted, replaced, spans duplicated, hard tokens spliced in). A parse
//! returns `Ok` or an error and never panics. Inputs are capped at 64 KiB.
//! `file:` profiles are left out (they read a path). Bounded: `FUZZ_CASES`
//! cases per parser (default 3000).

use bench_ycsb::profile::Profile;
use bench_ycsb::systems::{DeviceSpec, SystemKind};
use bench_ycsb::workload::Workload;
use proptest::prelude::*;

const WORKLOAD_A: &str = "# Yahoo! Cloud System Benchmark, workload A\n\
recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\n\
readallfields=true\nreadproportion=0.5\nupdateproportion=0.5\nscanproportion=0\ninsertproportion=0\n\
requestdistribution=zipfian\nfieldcount=10\nfieldlength=100\ninsertcount=1000\nwriteallfields=false\n";

const TOKENS: &[&str] = &[
    "1e308",
    "-1",
    "NaN",
    "inf",
    "18446744073709551616",
    "0",
    "0.0000001",
    "=",
    ":",
    ",",
    "\n",
    "#",
    "\\",
    "max",
    "s",
    "ms",
    "h",
    "KiB",
    "steps:",
    "silk:",
    "constant:",
    "kernel:",
    "emulated:",
    "low=",
    "peak=",
    "rbps=",
    "wbps=",
    "zipfian",
    "uniform",
    "latest",
    "hotspot",
    "proportion",
    "count",
    "é",
    "\u{0}",
    " ",
];

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, u8),
    Replace(usize, u8),
    Duplicate(usize, usize),
    Splice(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1usize..16).prop_map(|(a, l)| Edit::Delete(a, l)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Edit::Insert(a, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Edit::Replace(a, b)),
        (any::<usize>(), 1usize..64).prop_map(|(a, l)| Edit::Duplicate(a, l)),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(a, t)| Edit::Splice(a, t)),
    ]
}

fn mutate(text: &str, edits: &[Edit]) -> String {
    let mut b = text.as_bytes().to_vec();
    for e in edits {
        let at = |i: usize| i % (b.len() + 1);
        match *e {
            Edit::Delete(i, l) => {
                let i = at(i).min(b.len());
                b.drain(i..(i + l).min(b.len()));
            }
            Edit::Insert(i, x) => {
                let i = at(i);
                b.insert(i, x);
            }
            Edit::Replace(i, x) => {
                if !b.is_empty() {
                    let i = i % b.len();
                    b[i] = x;
                }
            }
            Edit::Duplicate(i, l) => {
                let i = at(i).min(b.len());
                let span = b[i..(i + l).min(b.len())].to_vec();
                b.splice(i..i, span);
            }
            Edit::Splice(i, t) => {
                let i = at(i);
                b.splice(i..i, TOKENS[t].bytes());
            }
        }
        b.truncate(64 << 10);
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn ycsb_property_files_never_panic(edits in prop::collection::vec(edit(), 1..10)) {
        let _ = Workload::from_properties("fuzz", &mutate(WORKLOAD_A, &edits));
    }

    #[test]
    fn profiles_never_panic(which in 0usize..16, edits in prop::collection::vec(edit(), 1..8)) {
        let named = bench_ycsb::profile::NAMED;
        let spec = mutate(named[which % named.len()].1, &edits);
        if !spec.trim_start().starts_with("file") {
            let _ = Profile::parse(&spec);
        }
        let _ = Profile::parse_schedule("fuzz", &mutate("0 1000\n10 5000 # peak\n20,1000\n", &edits));
    }

    #[test]
    fn devices_and_systems_never_panic(edits in prop::collection::vec(edit(), 1..8)) {
        let _ = mutate("kernel:rbps=64MiB,wbps=64MiB,riops=max", &edits).parse::<DeviceSpec>();
        let _ = mutate("emulated:64MiB/s", &edits).parse::<DeviceSpec>();
        let _ = SystemKind::parse_list(&mutate("rocksdb,rocksdb-autotuned,paio-silk,paio-static", &edits));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        let _ = Workload::from_properties("fuzz", &text);
        if !text.trim_start().starts_with("file") {
            let _ = Profile::parse(&text);
        }
        let _ = text.parse::<DeviceSpec>();
        let _ = SystemKind::parse_list(&text);
    }
}

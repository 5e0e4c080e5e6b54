//! The preload library against the kernel's throttle, on the same fio jobs.
//!
//! ```text
//! cargo run --release -p kv-preload --example fio_compare -- [--seconds 20] [--pairs 5]
//! ```
//!
//! Needs fio and, for the kernel's side, root and the cgroup v1 blkio
//! controller (its cgroup is removed at the end, also on failure). Prints
//! Markdown tables:
//!
//! 1. one limit at a time (4 KiB direct writes at `wbps`, 4 KiB direct
//!    random reads at `riops`, 64 KiB direct reads at `rbps`), under the
//!    library and in a blkio cgroup with the same limit: achieved rate, its
//!    error, and fio's completion latency p50/p99;
//! 2. two limited volumes and an unlimited one at once, against the
//!    unlimited job alone without the library;
//! 3. a live change from 4 to 8 MiB/s halfway through, from fio's
//!    per-second log;
//! 4. the cost for descriptors of no volume: 4 KiB random reads from the
//!    page cache with the library loaded (its volume elsewhere) and
//!    without, alternating, medians.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::{BlkioCgroup, Job, Measured, Under, data_file, device_of, err_pct, run, scratch, volumes, write_rules};

const MIB: f64 = 1048576.0;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

struct Case {
    what: &'static str,
    key: &'static str,
    limit: f64,
    job: Job,
    /// The io.max value and the blkio v1 file.
    io_max: String,
    blkio: (&'static str, u64),
}

fn achieved(m: &Measured, key: &str) -> f64 {
    if key.ends_with("iops") { m.iops } else { m.bw_bytes }
}

fn show(v: f64, key: &str) -> String {
    if key.ends_with("iops") { format!("{v:.1} IOPS") } else { format!("{:.1} KiB/s", v / 1024.0) }
}

fn main() {
    let secs = Duration::from_secs(arg("--seconds", 20));
    let pairs = arg("--pairs", 5) as usize;
    let dir = scratch();
    let d = dir.path();
    let dev = device_of(d);
    println!("fio {} s runs on {} (device {dev})\n", secs.as_secs(), d.display());
    for v in ["r", "b", "u"] {
        data_file(&d.join(v).join("data"), 256);
    }
    std::fs::create_dir_all(d.join("w")).unwrap();
    let rules = d.join("rules.toml");
    support::library();

    // 1. One limit at a time, library and kernel.
    let cases = [
        Case {
            what: "4 KiB direct writes",
            key: "wbps",
            limit: 4.0 * MIB,
            job: Job::new("w", &d.join("w/data"), "write", "4k", true),
            io_max: "wbps=4194304".into(),
            blkio: ("blkio.throttle.write_bps_device", 4 << 20),
        },
        Case {
            what: "4 KiB direct random reads",
            key: "riops",
            limit: 500.0,
            job: Job::new("r", &d.join("r/data"), "randread", "4k", true),
            io_max: "riops=500".into(),
            blkio: ("blkio.throttle.read_iops_device", 500),
        },
        Case {
            what: "64 KiB direct reads",
            key: "rbps",
            limit: 16.0 * MIB,
            job: Job::new("b", &d.join("b/data"), "read", "64k", true),
            io_max: "rbps=16777216".into(),
            blkio: ("blkio.throttle.read_bps_device", 16 << 20),
        },
    ];
    println!("| job | limit (io.max) | who | achieved | error | clat p50 | clat p99 |");
    println!("|---|---|---|---|---|---|---|");
    for c in &cases {
        let vol = c.job.file.parent().unwrap().to_owned();
        write_rules(&rules, &volumes(&[(c.job.name.as_str(), &vol, &c.io_max)]));
        let ours = run(std::slice::from_ref(&c.job), secs, Under::Preload(&rules), None).remove(0);
        let kernel = BlkioCgroup::new("kvsds-fio-compare", dev, &[c.blkio])
            .map(|cg| run(std::slice::from_ref(&c.job), secs, Under::Cgroup(&cg), None).remove(0));
        let row = |who: &str, m: &Measured| {
            let a = achieved(m, c.key);
            println!(
                "| {} | {} | {who} | {} | {:+.2}% | {:.0} us | {:.0} us |",
                c.what,
                c.io_max,
                show(a, c.key),
                err_pct(a, c.limit),
                m.clat_p50_us,
                m.clat_p99_us
            );
        };
        row("kv-preload", &ours);
        match kernel {
            Ok(k) => row("kernel blkio (v1)", &k),
            Err(e) => println!("| {} | {} | kernel blkio (v1) | not run: {e} | | | |", c.what, c.io_max),
        }
    }

    // 2. Two limited volumes and an unlimited one at once.
    let unlimited = Job::new("u", &d.join("u/data"), "randread", "4k", false);
    write_rules(
        &rules,
        &volumes(&[("w", &d.join("w"), "wbps=4MiB"), ("b", &d.join("b"), "rbps=16MiB"), ("u", &d.join("u"), "")]),
    );
    let alone = run(std::slice::from_ref(&unlimited), secs, Under::Nothing, None).remove(0);
    let jobs = [cases[0].job.clone(), cases[2].job.clone(), unlimited.clone()];
    // The same three jobs without the library (nothing limited): what the
    // other two cost the unlimited one in CPU and disk on this machine.
    let plain = run(&jobs, secs, Under::Nothing, None);
    let together = run(&jobs, secs, Under::Preload(&rules), None);
    println!("\n| volume | limit | achieved | error |");
    println!("|---|---|---|---|");
    println!(
        "| w | wbps=4MiB | {} | {:+.2}% |",
        show(together[0].bw_bytes, "wbps"),
        err_pct(together[0].bw_bytes, 4.0 * MIB)
    );
    println!(
        "| b | rbps=16MiB | {} | {:+.2}% |",
        show(together[1].bw_bytes, "rbps"),
        err_pct(together[1].bw_bytes, 16.0 * MIB)
    );
    println!(
        "| u | none (max) | {:.0} IOPS | {:+.2}% vs {:.0} IOPS alone without the library |",
        together[2].iops,
        err_pct(together[2].iops, alone.iops),
        alone.iops
    );
    println!(
        "| u | (same three jobs, no library) | {:.0} IOPS | u under the library {:+.2}% vs this |",
        plain[2].iops,
        err_pct(together[2].iops, plain[2].iops)
    );

    // 3. A live change halfway.
    write_rules(&rules, &volumes(&[("w", &d.join("w"), "wbps=4MiB")]));
    let logs = d.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let half = secs / 2;
    let changer = {
        let (rules, w) = (rules.clone(), d.join("w"));
        std::thread::spawn(move || {
            std::thread::sleep(half);
            write_rules(&rules, &volumes(&[("w", &w, "wbps=8MiB")]));
        })
    };
    let live = run(std::slice::from_ref(&cases[0].job), secs, Under::Preload(&rules), Some(&logs)).remove(0);
    changer.join().unwrap();
    println!(
        "\nLive change wbps=4MiB -> wbps=8MiB written {} s after fio started; fio's per-second log (KiB/s):",
        half.as_secs()
    );
    println!("{:?}", live.per_second_kib);

    // 4. Cost for descriptors of no volume.
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    write_rules(&rules, &volumes(&[("other", &elsewhere, "rbps=1MiB")]));
    let short = Duration::from_secs(arg("--overhead-seconds", 10));
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        without.push(run(std::slice::from_ref(&unlimited), short, Under::Nothing, None)[0].iops);
        with.push(run(std::slice::from_ref(&unlimited), short, Under::Preload(&rules), None)[0].iops);
    }
    let (a, b) = (median(without.clone()), median(with.clone()));
    println!(
        "\n4 KiB page-cache random reads, {pairs} alternating pairs of {} s: without the library median {a:.0} IOPS {without:.0?}, with it (no matching volume) median {b:.0} IOPS {with:.0?}: {:+.2}%",
        short.as_secs(),
        err_pct(b, a)
    );
}

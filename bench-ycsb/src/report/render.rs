//! Rendering a report: the comparison table and its companions, the
//! per-second CSV, SVG plots, `figures.md`, and a result directory's files.

use std::fmt::Write as _;
use std::path::Path;

use super::summary::{Medians, median, medians, per_system};
use super::{BenchReport, SecondReport};
use crate::error::{Error, Result};

/// The stamp as the first lines of a text report.
fn stamp(report: &BenchReport) -> String {
    let p = &report.provenance;
    format!(
        "# commit {}, {}\n# machine: {}\n# command: {}\n\n",
        if p.commit.is_empty() { "unknown" } else { &p.commit },
        if p.date.is_empty() { "date unknown" } else { &p.date },
        report.machine,
        p.command
    )
}

/// Milliseconds from µs, with more digits for small values.
fn ms(us: f64) -> String {
    let v = us / 1e3;
    if v.is_nan() {
        "-".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `median [min-max]` in ms.
fn ms_spread(median: f64, (lo, hi): (f64, f64), repeats: usize) -> String {
    if repeats > 1 { format!("{} [{}-{}]", ms(median), ms(lo), ms(hi)) } else { ms(median) }
}

fn num(v: f64, prec: usize) -> String {
    if v.is_nan() { "-".into() } else { format!("{v:.prec$}") }
}

/// The comparison table (medians over repeats; ratios to `rocksdb`). A
/// kernel-device run whose written bytes the kernel saw less than 90% of
/// is marked `LOW` in the `kernel w` column.
pub fn table(report: &BenchReport) -> String {
    let meds = medians(report);
    let groups = per_system(report);
    let base = meds.iter().find(|g| g.name == "rocksdb");
    let kernel = meds.iter().any(|m| !m.write_charged.is_nan());
    let ops: Vec<String> = {
        let mut v: Vec<String> = report.systems.iter().flat_map(|s| s.per_op.keys().cloned()).collect();
        v.sort();
        v.dedup();
        v
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "{:<18} {:>9} {:>7} {:>9} {:>9} {:>10} {:>8} {:>10}",
        "system", "ops/s", "x base", "p50 µs", "p99 µs", "p99.9 µs", "p99 x", "peak p99"
    );
    for op in &ops {
        let _ = write!(s, " {:>12}", format!("{} p99", op.to_lowercase()));
    }
    let _ = write!(s, " {:>8} {:>10} {:>8}", "stall s", "max stall", "dropped");
    if kernel {
        let _ = write!(s, " {:>9}", "kernel w");
    }
    let spread = meds.iter().any(|m| m.repeats > 1);
    if spread {
        let _ = write!(s, "  {:<24}", "p99 ms [min-max]");
    }
    s.push('\n');
    for (m, (_, rs)) in meds.iter().zip(&groups) {
        let _ = write!(
            s,
            "{:<18} {:>9.0} {:>7} {:>9.0} {:>9.0} {:>10.0} {:>8} {:>10}",
            m.name,
            m.throughput_ops,
            base.map_or("-".into(), |b| format!("{:.3}", m.throughput_ops / b.throughput_ops)),
            m.p50_us,
            m.p99_us,
            m.p999_us,
            base.map_or("-".into(), |b| format!("{:.3}", m.p99_us / b.p99_us)),
            num(m.peak_p99_us, 0),
        );
        for op in &ops {
            let v =
                median(rs.iter().map(|r| r.per_op.get(op).map_or(f64::NAN, |o| o.intended.p99_us as f64)).collect());
            let _ = write!(s, " {:>12.0}", v);
        }
        let _ = write!(s, " {:>8.1} {:>8.0}ms {:>8.0}", m.stall_s, m.longest_stall_ms, m.dropped);
        if kernel {
            let flag = if m.low_charge { " LOW" } else { "" };
            let _ = write!(s, " {:>9}", format!("{}%{flag}", num(m.write_charged * 100.0, 0)));
        }
        if spread {
            let _ = write!(s, "  {:<24}", ms_spread(m.p99_us, m.p99_range_us, m.repeats));
        }
        s.push('\n');
    }
    s.push_str(&levels_table(report));
    s.push_str(&debt_table(report));
    let attributed: Vec<(String, usize, &crate::attribution::Attribution)> =
        report.systems.iter().filter_map(|r| Some((r.name.clone(), r.repeat, r.attribution.as_ref()?))).collect();
    if !attributed.is_empty() {
        s.push('\n');
        s.push_str(&crate::attribution::table(&attributed));
    }
    s.push_str(&probe_table(report));
    s.push_str(&lateness_table(report));
    s
}

/// How late the clients issued the requests they slept for, per system
/// (medians over repeats): the load generator's own part of the latencies
/// above (empty when no repeat has it).
pub(super) fn lateness_table(report: &BenchReport) -> String {
    let mut s = String::new();
    let slack: Vec<String> = {
        let mut v: Vec<String> = report
            .systems
            .iter()
            .filter_map(|r| r.issue_lateness.as_ref())
            .map(|l| l.timer_slack_ns.map_or_else(|| "unknown".to_owned(), |n| format!("{n} ns")))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    if slack.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "\nclients: how late a client issued a request it had slept for (the load generator's own part of its latency; timer slack {}), median over repeats, µs",
        slack.join(", ")
    );
    let _ = writeln!(s, "{:<18} {:>10} {:>9} {:>9} {:>9}", "system", "slept", "late p50", "late p99", "late max");
    for (name, rs) in per_system(report) {
        let ls: Vec<&super::IssueLateness> = rs.iter().filter_map(|r| r.issue_lateness.as_ref()).collect();
        if ls.is_empty() {
            continue;
        }
        let m = |f: &dyn Fn(&super::IssueLateness) -> u64| num(median(ls.iter().map(|l| f(l) as f64).collect()), 0);
        let _ = writeln!(
            s,
            "{:<18} {:>10} {:>9} {:>9} {:>9}",
            name,
            m(&|l| l.requests),
            m(&|l| l.p50_us),
            m(&|l| l.p99_us),
            m(&|l| l.max_us)
        );
    }
    s
}

/// The disk probe's reads per repeat next to the repeat's client p99
/// (empty when no repeat had the probe).
pub(super) fn probe_table(report: &BenchReport) -> String {
    let probed: Vec<_> = report.systems.iter().filter_map(|r| Some((r, r.disk_probe.as_ref()?))).collect();
    let Some((_, first)) = probed.first() else { return String::new() };
    let mut s = String::new();
    let inside = probed.iter().any(|(_, p)| !p.outside_throttle);
    let _ = writeln!(
        s,
        "\ndisk probe: a 4 KiB direct read of a file on the same disk every {} ms, {}, while the clock ran (what the disk gave anyone then), ms; the clients' worst second (its p99, and when), and the disk stalls (probe reads of {} ms or more: when each ended, s, and what it took, ms)",
        first.interval_ms,
        if inside { "INSIDE the throttle in some repeats" } else { "outside the throttle" },
        crate::disk_probe::DISK_STALL.as_millis()
    );
    let _ = writeln!(
        s,
        "{:<22} {:>11} {:>10} {:>10} {:>10} {:>8} {:>10} {:>15}  disk stalls",
        "system #", "client p99", "probe p50", "probe p99", "probe max", "reads", "reads ≥1ms", "worst second",
    );
    for (r, p) in &probed {
        let worst = r
            .seconds
            .iter()
            .max_by_key(|x| x.p99_us)
            .map(|x| format!("{} @{}s", ms(x.p99_us as f64), x.t))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{:<22} {:>11} {:>10} {:>10} {:>10} {:>8} {:>10} {:>15}  {}",
            format!("{} #{}", r.name, r.repeat),
            ms(r.p99_us as f64),
            ms(p.p50_us as f64),
            ms(p.p99_us as f64),
            ms(p.max_us as f64),
            p.reads,
            p.reads_over_1ms,
            worst,
            stalls_cell(p)
        );
    }
    s
}

/// The disk stalls of one repeat, as the probe table lists them: when each
/// ended and what it took, `-` for none, and `not recorded` for a run
/// made before bench-ycsb kept them (its slowest read is a stall, its list
/// empty).
fn stalls_cell(p: &crate::disk_probe::ProbeStats) -> String {
    if p.stalls.is_empty() {
        let stalled = u128::from(p.max_us) >= crate::disk_probe::DISK_STALL.as_micros();
        return if stalled { "not recorded (an older run)".to_owned() } else { "-".to_owned() };
    }
    let mut stalls: Vec<String> =
        p.stalls.iter().map(|x| format!("{:.1}s: {}", x.end_us as f64 / 1e6, ms(f64::from(x.latency_us)))).collect();
    if p.stall_reads > p.stalls.len() as u64 {
        stalls.push(format!("and {} more", p.stall_reads - p.stalls.len() as u64));
    }
    stalls.join(", ")
}

/// The work each system left when the clock stopped (medians over
/// repeats), the time RocksDB took to finish it, and `DEBT` where a
/// repeat's debt was above 1.25x plain RocksDB's in the same repeat.
pub fn debt_table(report: &BenchReport) -> String {
    if report.systems.iter().all(|r| r.debt.is_none()) {
        return String::new();
    }
    let mut s = String::from(
        "
end-of-run debt (median over repeats; drain: until RocksDB reports nothing pending)
",
    );
    let _ = writeln!(
        s,
        "{:<18} {:>12} {:>9} {:>10} {:>9} {:>10} {:>7}",
        "system", "pending MiB", "L0 files", "immutable", "drain s", "x rocksdb", "flag"
    );
    let plain_of =
        |r: usize| report.systems.iter().find(|x| x.name == "rocksdb" && x.repeat == r).and_then(|x| x.debt.clone());
    for (name, rs) in per_system(report) {
        let ds: Vec<&crate::debt::Debt> = rs.iter().filter_map(|r| r.debt.as_ref()).collect();
        if ds.is_empty() {
            continue;
        }
        let m = |f: &dyn Fn(&crate::debt::Debt) -> f64| median(ds.iter().map(|d| f(d)).collect());
        let ratio = median(
            rs.iter()
                .filter_map(|r| {
                    let (d, p) = (r.debt.as_ref()?, plain_of(r.repeat)?);
                    Some(d.score_bytes / p.score_bytes.max(d.memtable_bytes as f64))
                })
                .collect(),
        );
        let flagged = rs.iter().any(|r| match (&r.debt, plain_of(r.repeat)) {
            (Some(d), Some(p)) => d.flagged_against(&p),
            _ => false,
        });
        let drain = m(&|d| d.drain_ms.map_or(f64::NAN, |v| v as f64 / 1e3));
        let timed_out = ds.iter().any(|d| d.drain_ms.is_none() && d.drain_timeout_ms > 0);
        let _ = writeln!(
            s,
            "{:<18} {:>12.1} {:>9.0} {:>10.0} {:>9} {:>10} {:>7}",
            name,
            m(&|d| d.pending_compaction_bytes as f64 / 1048576.0),
            m(&|d| d.l0_files as f64),
            m(&|d| d.immutable_memtables as f64),
            if timed_out { format!(">{}", ds[0].drain_timeout_ms / 1000) } else { num(drain, 1) },
            num(ratio, 2),
            if flagged { "DEBT" } else { "" },
        );
    }
    s
}

/// Compaction MiB written per level pair during the run (median over
/// repeats), and the tagged bytes against what RocksDB reported for the
/// completed jobs. Empty when no system ran on the stage.
pub fn levels_table(report: &BenchReport) -> String {
    let mut pairs: Vec<(usize, String)> = Vec::new();
    for l in report.systems.iter().flat_map(|r| &r.compaction_levels) {
        if !pairs.iter().any(|(_, p)| *p == l.context) {
            let order = kv_stage::RequestContext::COMPACTION_PAIRS
                .iter()
                .position(|c| c.name() == l.context)
                .unwrap_or(usize::MAX);
            pairs.push((order, l.context.clone()));
        }
    }
    if pairs.is_empty() {
        return String::new();
    }
    pairs.sort();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut s = String::from("\ncompaction MiB written per level pair (tagged; median over repeats)\n");
    let _ = write!(s, "{:<18}", "system");
    for (_, p) in &pairs {
        let _ = write!(s, " {:>9}", p.strip_prefix("bg_compaction_").unwrap_or(p));
    }
    let _ = writeln!(s, " {:>12}", "vs RocksDB");
    for (name, rs) in per_system(report) {
        if rs.iter().all(|r| r.compaction_levels.is_empty()) {
            continue;
        }
        let _ = write!(s, "{name:<18}");
        for (_, p) in &pairs {
            let v = median(
                rs.iter()
                    .map(|r| {
                        r.compaction_levels.iter().find(|l| l.context == *p).map_or(0.0, |l| mib(l.tagged_written))
                    })
                    .collect(),
            );
            let _ = write!(s, " {v:>9.1}");
        }
        let ratio = median(
            rs.iter()
                .map(|r| {
                    let t: u64 = r.compaction_levels.iter().map(|l| l.tagged_written).sum();
                    let k: u64 = r.compaction_levels.iter().map(|l| l.rocksdb_written).sum();
                    if k == 0 { f64::NAN } else { t as f64 / k as f64 }
                })
                .collect(),
        );
        let _ = writeln!(s, " {:>12}", format!("{}%", num(ratio * 100.0, 1)));
    }
    s
}

/// The per-second time series as CSV.
pub fn timeseries_csv(report: &BenchReport) -> String {
    let mut s = String::from("system,repeat,second,throughput_ops,p50_us,p99_us,p999_us\n");
    for r in &report.systems {
        for sec in &r.seconds {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{}",
                r.name, r.repeat, sec.t, sec.throughput_ops, sec.p50_us, sec.p99_us, sec.p999_us
            );
        }
    }
    s
}

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// An SVG line plot of one per-second metric for every system (first
/// repeat of each). `log` plots the y axis on a log scale.
pub fn svg_plot(
    report: &BenchReport,
    title: &str,
    y_label: &str,
    log: bool,
    value: &dyn Fn(&SecondReport) -> f64,
) -> String {
    let (w, h, ml, mr, mt, mb) = (960.0, 420.0, 80.0, 190.0, 40.0, 50.0);
    let series: Vec<(String, Vec<(f64, f64)>)> = per_system(report)
        .into_iter()
        .filter_map(|(name, rs)| {
            let r = rs.first()?;
            let pts = r.seconds.iter().map(|s| (s.t as f64, value(s))).filter(|p| p.1.is_finite()).collect();
            Some((name, pts))
        })
        .collect();
    let x_max = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).fold(1.0, f64::max);
    let y_max_raw = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold(0.0, f64::max);
    let tr = |v: f64| if log { v.max(1.0).log10() } else { v };
    let y_max = if log { tr(y_max_raw).ceil().max(1.0) } else { (y_max_raw * 1.1).max(1.0) };
    let y_min = 0.0;
    let px = |x: f64| ml + (x / x_max) * (w - ml - mr);
    let py = |y: f64| mt + (1.0 - (tr(y) - y_min) / (y_max - y_min)) * (h - mt - mb);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        (w - mr + ml) / 2.0,
        escape(title)
    );
    // Axes and grid.
    let _ = writeln!(s, r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, h - mb, w - mr, h - mb);
    let _ = writeln!(s, r#"<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#, h - mb);
    let ticks: Vec<f64> = if log {
        (0..=y_max as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=5).map(|i| y_max * i as f64 / 5.0).collect()
    };
    for t in ticks {
        let y = py(t);
        let _ = writeln!(s, r##"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##, w - mr);
        let label = if t >= 10_000.0 { format!("{:.0}k", t / 1000.0) } else { format!("{t:.0}") };
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{label}</text>"#, ml - 6.0, y + 4.0);
    }
    // Round steps (10 s, 20 s, ...), about ten ticks.
    let x_step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0]
        .into_iter()
        .find(|&st| st >= x_max / 10.0)
        .unwrap_or((x_max / 10.0).ceil());
    let mut x = 0.0;
    while x <= x_max {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{x:.0}</text>"#, px(x), h - mb + 18.0);
        x += x_step;
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">time (s)</text>"#, (w - mr + ml) / 2.0, h - 10.0);
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        (h - mb + mt) / 2.0,
        (h - mb + mt) / 2.0,
        escape(y_label)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ =
            writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{}"/>"#, path.join(" "));
        let ly = mt + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/>"#,
            w - mr + 15.0,
            w - mr + 40.0
        );
        let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, w - mr + 46.0, ly + 4.0, escape(name));
    }
    s.push_str("</svg>\n");
    s
}

/// Writes every output file into `dir`.
pub fn write_all(report: &BenchReport, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(Error::io(format!("writing {}", dir.join(name).display())))
    };
    write("summary.json", &serde_json::to_string_pretty(report).expect("report serializes"))?;
    write("timeseries.csv", &timeseries_csv(report))?;
    write("table.txt", &format!("{}{}", stamp(report), table(report)))?;
    for r in &report.systems {
        write(&format!("ycsb-{}-{}.txt", r.name, r.repeat), &r.ycsb_text())?;
    }
    write(
        "throughput.svg",
        &svg_plot(report, &format!("{}: completions per second", report.workload), "ops/s", false, &|s| {
            s.throughput_ops as f64
        }),
    )?;
    write(
        "p99.svg",
        &svg_plot(
            report,
            &format!("{}: p99 latency per second (from scheduled time)", report.workload),
            "µs (log)",
            true,
            // Latencies are filed by scheduled second; a second with none
            // (e.g. one past the schedule holding only late completions)
            // has no point. Recorded latencies are at least 1 µs.
            &|s| {
                if s.p99_us == 0 { f64::NAN } else { s.p99_us as f64 }
            },
        ),
    )?;
    Ok(())
}

/// Reads `summary.json` from a result directory.
pub fn read(dir: &Path) -> Result<BenchReport> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{}: {e}", path.display())))
}

/// `figures.md`: every workload's table and plots side by side, with the
/// device, options and machine. `done` holds each result directory (under
/// `root`) with its report.
pub fn figures_md(
    done: &[(std::path::PathBuf, BenchReport)],
    root: &Path,
    command: &str,
    elapsed: std::time::Duration,
) -> String {
    let mut s = String::new();
    let Some((_, first)) = done.first() else { return s };
    let meds: Vec<Vec<Medians>> = done.iter().map(|(_, r)| medians(r)).collect();
    let _ = writeln!(s, "# YCSB: the paper's workloads, side by side\n");
    let _ = writeln!(s, "- Command: `{command}` ({:.0} min so far)", elapsed.as_secs_f64() / 60.0);
    let _ = writeln!(s, "- Device: {}", first.device);
    let _ = writeln!(
        s,
        "- Load: {}; {} client threads; {:.0} s schedule per run",
        first.profile, first.threads, first.duration_s
    );
    let _ = writeln!(s, "- Machine: {}", first.machine);
    let _ = writeln!(s, "- Commit: {} (first run started {})", first.provenance.commit, first.provenance.date);
    let _ = writeln!(s, "- Settings and RocksDB options: {}", first.config);
    let _ = writeln!(
        s,
        "- Latency is measured from each request's scheduled time (open loop). Figures are medians over each system's repeats, with the lowest and highest repeat in brackets; plots show the first repeat.\n"
    );
    // One overview: p99 and throughput against plain RocksDB, per workload and start.
    let _ = writeln!(s, "## Overview: p99 (and throughput) as a ratio to plain `rocksdb`\n");
    let mut header = String::from("| system |");
    let mut rule = String::from("|---|");
    for (_, r) in done {
        let _ = write!(header, " {} {} |", r.workload, r.start);
        rule.push_str("---|");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    let names: Vec<String> = {
        let mut v = Vec::new();
        for m in meds.iter().flatten() {
            if !v.contains(&m.name) {
                v.push(m.name.clone());
            }
        }
        v
    };
    for name in &names {
        let _ = write!(s, "| {name} |");
        for ms in &meds {
            let base = ms.iter().find(|m| m.name == "rocksdb");
            let cell = match (ms.iter().find(|m| &m.name == name), base) {
                (Some(m), Some(b)) => format!(
                    "{:.3}x p99 ({} ms), {:.3}x ops/s",
                    m.p99_us / b.p99_us,
                    ms_spread(m.p99_us, m.p99_range_us, m.repeats),
                    m.throughput_ops / b.throughput_ops
                ),
                (Some(m), None) => format!("{} ms p99", ms_spread(m.p99_us, m.p99_range_us, m.repeats)),
                _ => "-".into(),
            };
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }
    for (dir, r) in done {
        let rel = dir.strip_prefix(root).unwrap_or(dir).display().to_string();
        let _ = writeln!(s, "\n## {} ({} start)\n", r.workload, r.start);
        let _ = writeln!(s, "```\n{}```\n", table(r));
        let _ = writeln!(s, "p99 per phase of the load, µs (medians over repeats):\n");
        let phases: Vec<String> = {
            let mut v: Vec<String> = Vec::new();
            for sys in &r.systems {
                for p in &sys.phases {
                    if !v.contains(&p.phase) {
                        v.push(p.phase.clone());
                    }
                }
            }
            v
        };
        let _ = writeln!(s, "| system | {} |", phases.join(" | "));
        let _ = writeln!(s, "|---|{}", "---|".repeat(phases.len()));
        for (name, rs) in per_system(r) {
            let cells: Vec<String> = phases
                .iter()
                .map(|ph| num(median(rs.iter().filter_map(|x| x.phase_p99(ph)).map(|v| v as f64).collect()), 0))
                .collect();
            let _ = writeln!(s, "| {name} | {} |", cells.join(" | "));
        }
        let _ = writeln!(s, "\n![throughput]({rel}/throughput.svg)\n![p99]({rel}/p99.svg)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk_probe::{ProbeRead, ProbeStats};

    fn probe(max_us: u64, stall_reads: u64, stalls: Vec<ProbeRead>) -> ProbeStats {
        ProbeStats {
            interval_ms: 20,
            reads: 2000,
            p50_us: 80,
            p99_us: 170,
            max_us,
            reads_over_1ms: stall_reads,
            stall_reads,
            stalls,
            outside_throttle: true,
        }
    }

    /// A stall is listed with when it ended; none is `-`; a run from
    /// before the list, whose slowest read was a stall, says so rather
    /// than `-`.
    #[test]
    fn the_stalls_cell_tells_none_from_not_recorded() {
        let one = vec![ProbeRead { end_us: 24_100_000, latency_us: 99_434 }];
        assert_eq!(stalls_cell(&probe(99_434, 1, one.clone())), format!("24.1s: {}", ms(99_434.0)));
        assert_eq!(stalls_cell(&probe(99_434, 3, one)), format!("24.1s: {}, and 2 more", ms(99_434.0)));
        assert_eq!(stalls_cell(&probe(8_160, 0, Vec::new())), "-");
        assert_eq!(stalls_cell(&probe(60_673, 0, Vec::new())), "not recorded (an older run)");
    }
}

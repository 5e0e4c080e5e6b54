//! Several runs of one command, pooled (`bench-ycsb pool DIR...`).
//!
//! One run's median over 3 or 5 repeats moves from run to run by more than
//! the margins the targets set: on the kernel device a calm run's p99 ratio
//! to plain RocksDB moved between 0.96x and 1.11x from run to run for the
//! pass-through system, which applies no policy at all. Pooling several
//! runs of the same command tells a systematic cost from that noise:
//!
//! - **Per run**, the figure a single run reports: the system's median p99
//!   over its repeats divided by the baseline's, one value per run, with
//!   how many runs were at or under a target when one is given.
//! - **Paired**, every repeat against the baseline's repeat of the same
//!   number in the same run (the runs alternate systems repeat by repeat,
//!   so the two ran minutes apart on the same machine), and the median of
//!   those ratios over all runs. Its 95% interval is a bootstrap over runs
//!   (runs drawn with replacement, 2,000 draws, a fixed seed, so the same
//!   directories give the same interval): it counts the differences
//!   between runs (and machines), not only those between repeats. With
//!   fewer than 3 runs there is no interval.
//!
//! Only runs of one command pool: the workload, profile, start, threads,
//! schedule, seed, device, every setting in `config`, the clients' timer
//! slack and the disk probe's interval must be the same, and an error
//! names the directory and the first setting that differs.
//! Machines and commits may differ; the table lists each run's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::generator::Rng;
use crate::report::{self, BenchReport, median, per_system, range};
use crate::{Error, Result};

/// Bootstrap draws for the paired ratio's interval.
const DRAWS: usize = 2000;
/// The bootstrap's seed.
const SEED: u64 = 42;
/// Fewest runs for an interval.
const MIN_RUNS_FOR_INTERVAL: usize = 3;

/// One pooled run.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    /// The results directory, as given.
    pub dir: String,
    /// Its provenance commit (empty for runs made before the stamp).
    pub commit: String,
    /// When it started.
    pub date: String,
    /// The machine it ran on.
    pub machine: String,
}

/// A ratio to the baseline, pooled over the pairs of every run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    /// Pairs (a repeat and the baseline's repeat of the same number).
    pub pairs: usize,
    /// The median of the pairs' ratios.
    pub median: f64,
    /// The bootstrap's 95% interval of that median (runs drawn with
    /// replacement); `None` with fewer than 3 runs.
    pub interval: Option<(f64, f64)>,
}

/// One system over every run.
#[derive(Debug, Clone, Serialize)]
pub struct SystemPool {
    /// System name.
    pub name: String,
    /// Runs it was in.
    pub runs: usize,
    /// Its repeats over all runs.
    pub repeats: usize,
    /// p99 over all its repeats, µs: median, lowest, highest.
    pub p99_us: (f64, f64, f64),
    /// Per run (in the order given): its median p99 over the baseline's.
    pub run_p99_ratios: Vec<f64>,
    /// Runs whose ratio was at or under the target, when one was given.
    pub runs_within_target: Option<usize>,
    /// p50 ratio, paired.
    pub paired_p50: Paired,
    /// p99 ratio, paired.
    pub paired_p99: Paired,
    /// p99.9 ratio, paired.
    pub paired_p999: Paired,
}

/// Every system over every run.
#[derive(Debug, Clone, Serialize)]
pub struct Pool {
    /// The runs, in the order given.
    pub runs: Vec<RunInfo>,
    /// The system ratios are to.
    pub baseline: String,
    /// The target the per-run ratios were held to, if any.
    pub target: Option<f64>,
    /// Workload, profile, start and device of the runs (the same in all).
    pub setup: String,
    /// Every system but the baseline, in first-run order.
    pub systems: Vec<SystemPool>,
}

/// Reads `summary.json` from each directory and checks that they are runs
/// of one command.
pub fn read_runs(dirs: &[PathBuf]) -> Result<Vec<(PathBuf, BenchReport)>> {
    if dirs.is_empty() {
        return Err(Error::Usage("pool: give one or more results directories (each with summary.json)".into()));
    }
    let runs: Vec<(PathBuf, BenchReport)> =
        dirs.iter().map(|d| report::read(d).map(|r| (d.clone(), r))).collect::<Result<_>>()?;
    check_same_command(&runs)?;
    Ok(runs)
}

/// An error naming the first directory whose setup differs from the
/// first's, and the setting.
pub fn check_same_command(runs: &[(PathBuf, BenchReport)]) -> Result<()> {
    let Some((first_dir, first)) = runs.first() else { return Ok(()) };
    for (dir, r) in &runs[1..] {
        let fields: [(&str, String, String); 7] = [
            ("workload", first.workload.clone(), r.workload.clone()),
            ("profile", first.profile.clone(), r.profile.clone()),
            ("start", first.start.clone(), r.start.clone()),
            ("threads", first.threads.to_string(), r.threads.to_string()),
            ("duration_s", first.duration_s.to_string(), r.duration_s.to_string()),
            ("seed", first.seed.to_string(), r.seed.to_string()),
            ("device", first.device.clone(), r.device.clone()),
        ];
        let differs = fields
            .into_iter()
            .chain(run_settings(first, r))
            .find(|(_, a, b)| a != b)
            .map(|(f, a, b)| (f.to_string(), a, b))
            .or_else(|| first_difference("config", &first.config, &r.config));
        if let Some((field, a, b)) = differs {
            return Err(Error::Usage(format!(
                "{}: {field} is {b}, but {} has {a}; only runs of one command pool",
                dir.display(),
                first_dir.display()
            )));
        }
    }
    Ok(())
}

/// What a run's repeats record of how the load generator ran, which
/// `config` does not hold: the clients' timer slack (runs before it was
/// recorded slept with Linux's 50 µs default, each sleep about 75 µs late)
/// and the disk probe's interval (off, or runs from before it existed).
fn run_settings(first: &BenchReport, r: &BenchReport) -> [(&'static str, String, String); 2] {
    let slack = |r: &BenchReport| {
        r.systems.first().and_then(|s| s.issue_lateness.as_ref()).and_then(|l| l.timer_slack_ns).map_or_else(
            || "not recorded (a run from before the clients' timer slack was set and recorded)".to_string(),
            |ns| format!("{ns} ns"),
        )
    };
    let probe = |r: &BenchReport| {
        r.systems
            .first()
            .and_then(|s| s.disk_probe.as_ref())
            .map_or_else(|| "off or not recorded".to_string(), |p| format!("every {} ms", p.interval_ms))
    };
    [("the clients' timer slack", slack(first), slack(r)), ("the disk probe", probe(first), probe(r))]
}

/// The first key (as a dotted path under `path`) where `a` and `b` differ,
/// with the two values.
fn first_difference(path: &str, a: &serde_json::Value, b: &serde_json::Value) -> Option<(String, String, String)> {
    match (a, b) {
        (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let sub = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => first_difference(&sub, p, q),
                    (None, Some(v)) | (Some(v), None) if was_before_recorded(&sub, v) => None,
                    (p, q) => Some((sub, show(p), show(q))),
                }
            })
        }
        _ if a != b => Some((path.to_string(), a.to_string(), b.to_string())),
        _ => None,
    }
}

/// Settings added to the configuration after runs were recorded, with the
/// value every run from before them had in effect: a run that records no
/// such key pools with one that records that value (and only that value).
const ADDED_LATER: &[(&str, serde_json::Value)] = &[
    // Before it existed, deep compactions got the contended budget while
    // the ingest path was idle: `false`.
    ("config.adaptive.deep_at_floor", serde_json::Value::Bool(false)),
];

/// Whether `value` at `path`, absent from the other run, is what that run
/// had in effect before the setting was recorded.
fn was_before_recorded(path: &str, value: &serde_json::Value) -> bool {
    ADDED_LATER.iter().any(|(p, v)| *p == path && value == v)
}

fn show(v: Option<&serde_json::Value>) -> String {
    v.map_or_else(|| "absent".to_string(), serde_json::Value::to_string)
}

/// Pools `runs` (already checked by [`check_same_command`]) against
/// `baseline`, a system name every run must have.
pub fn pool(runs: &[(PathBuf, BenchReport)], baseline: &str, target: Option<f64>) -> Result<Pool> {
    let Some((_, first)) = runs.first() else {
        return Err(Error::Usage("pool: no runs".into()));
    };
    for (dir, r) in runs {
        if !r.systems.iter().any(|s| s.name == baseline) {
            return Err(Error::Usage(format!(
                "{}: no repeat of the baseline system '{baseline}' (it has: {})",
                dir.display(),
                names(r).join(", ")
            )));
        }
    }
    let mut order: Vec<String> = Vec::new();
    for (_, r) in runs {
        for n in names(r) {
            if n != baseline && !order.contains(&n) {
                order.push(n);
            }
        }
    }
    let systems = order.into_iter().map(|name| system_pool(runs, baseline, &name, target)).collect();
    Ok(Pool {
        runs: runs
            .iter()
            .map(|(d, r)| RunInfo {
                dir: d.display().to_string(),
                commit: r.provenance.commit.clone(),
                date: r.provenance.date.clone(),
                machine: r.machine.clone(),
            })
            .collect(),
        baseline: baseline.to_string(),
        target,
        setup: format!("`{}`, {}, {} start; {}", first.workload, first.profile, first.start, first.device),
        systems,
    })
}

/// The systems of a run, in run order.
fn names(r: &BenchReport) -> Vec<String> {
    per_system(r).into_iter().map(|(n, _)| n).collect()
}

fn system_pool(runs: &[(PathBuf, BenchReport)], baseline: &str, name: &str, target: Option<f64>) -> SystemPool {
    let q = [
        |s: &report::SystemReport| s.p50_us,
        |s: &report::SystemReport| s.p99_us,
        |s: &report::SystemReport| s.p999_us,
    ];
    // Per quantile, per run: the ratios of the run's pairs.
    let mut pairs: [Vec<Vec<f64>>; 3] = Default::default();
    let mut run_ratios = Vec::new();
    let mut p99s = Vec::new();
    let mut in_runs = 0;
    for (_, r) in runs {
        let mine: Vec<_> = r.systems.iter().filter(|s| s.name == name).collect();
        if mine.is_empty() {
            continue;
        }
        in_runs += 1;
        let base: Vec<_> = r.systems.iter().filter(|s| s.name == baseline).collect();
        p99s.extend(mine.iter().map(|s| s.p99_us as f64));
        let med = |v: &[&report::SystemReport]| median(v.iter().map(|s| s.p99_us as f64).collect());
        run_ratios.push(med(&mine) / med(&base));
        for (qi, f) in q.iter().enumerate() {
            let run: Vec<f64> = mine
                .iter()
                .filter_map(|s| {
                    let b = base.iter().find(|b| b.repeat == s.repeat)?;
                    (f(b) > 0).then(|| f(s) as f64 / f(b) as f64)
                })
                .collect();
            pairs[qi].push(run);
        }
    }
    let [p50, p99, p999] = pairs.map(|runs| paired(&runs));
    let (lo, hi) = range(p99s.iter().copied());
    SystemPool {
        name: name.to_string(),
        runs: in_runs,
        repeats: p99s.len(),
        p99_us: (median(p99s), lo, hi),
        runs_within_target: target.map(|t| run_ratios.iter().filter(|r| **r <= t).count()),
        run_p99_ratios: run_ratios,
        paired_p50: p50,
        paired_p99: p99,
        paired_p999: p999,
    }
}

/// The median of every run's pairs, with the bootstrap over runs.
fn paired(runs: &[Vec<f64>]) -> Paired {
    let runs: Vec<&Vec<f64>> = runs.iter().filter(|r| !r.is_empty()).collect();
    let all: Vec<f64> = runs.iter().flat_map(|r| r.iter().copied()).collect();
    let interval = (runs.len() >= MIN_RUNS_FOR_INTERVAL).then(|| {
        let mut rng = Rng::new(SEED);
        let mut meds: Vec<f64> = (0..DRAWS)
            .map(|_| {
                let draw: Vec<f64> =
                    (0..runs.len()).flat_map(|_| runs[rng.below(runs.len() as u64) as usize].iter().copied()).collect();
                median(draw)
            })
            .collect();
        meds.sort_by(f64::total_cmp);
        (meds[DRAWS * 25 / 1000], meds[DRAWS * 975 / 1000 - 1])
    });
    Paired { pairs: all.len(), median: median(all), interval }
}

/// The pool as a text table (what `bench-ycsb pool` prints and writes to
/// `pool.txt`).
pub fn table(p: &Pool) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "pooled: {} runs of {}; ratios to {}", p.runs.len(), p.setup, p.baseline);
    let w = p.runs.iter().map(|r| r.machine.chars().count()).max().unwrap_or(0).max("machine".len());
    let _ = writeln!(s, "\n{:<4} {:<14} {:<21} {:<w$} directory", "run", "commit", "started", "machine");
    for (i, r) in p.runs.iter().enumerate() {
        let commit: String = match r.commit.as_str() {
            "" => "-".into(),
            c => {
                let short: String = c.chars().take(8).collect();
                if c.ends_with("-dirty") { format!("{short}-dirty") } else { short }
            }
        };
        let date = if r.date.is_empty() { "-" } else { r.date.as_str() };
        let _ = writeln!(s, "{:<4} {:<14} {:<21} {:<w$} {}", i + 1, commit, date, r.machine, r.dir);
    }
    let target = p.target.map_or(String::new(), |t| format!(", runs at or under {t}x"));
    let _ = writeln!(
        s,
        "\nper run: the system's median p99 over the baseline's (the figure one run reports){target}; paired: each \
         repeat over the baseline's repeat of the same number in the same run, median over all runs' pairs, with a \
         95% bootstrap interval over runs (3 runs or more)"
    );
    let _ = writeln!(
        s,
        "{:<20} {:>4} {:>7}  {:<26} {:<36} {:<28} {:<28} {:<28}",
        "system",
        "runs",
        "repeats",
        "p99 ms, all repeats",
        "per run p99 x: median [min-max]",
        "paired p99 x",
        "paired p99.9 x",
        "paired p50 x"
    );
    for sp in &p.systems {
        let (m, lo, hi) = sp.p99_us;
        let all = format!("{:.2} [{:.2}-{:.2}]", m / 1e3, lo / 1e3, hi / 1e3);
        let rr = &sp.run_p99_ratios;
        let (lo_r, hi_r) = range(rr.iter().copied());
        let mut per_run = format!("{:.3} [{:.3}-{:.3}]", median(rr.clone()), lo_r, hi_r);
        if let Some(n) = sp.runs_within_target {
            let _ = write!(per_run, " {n}/{}", rr.len());
        }
        let _ = writeln!(
            s,
            "{:<20} {:>4} {:>7}  {:<26} {:<36} {:<28} {:<28} {:<28}",
            sp.name,
            sp.runs,
            sp.repeats,
            all,
            per_run,
            paired_cell(&sp.paired_p99),
            paired_cell(&sp.paired_p999),
            paired_cell(&sp.paired_p50)
        );
    }
    s
}

fn paired_cell(p: &Paired) -> String {
    match p.interval {
        Some((lo, hi)) => format!("{:.3} [{lo:.3}-{hi:.3}] n={}", p.median, p.pairs),
        None => format!("{:.3} n={}", p.median, p.pairs),
    }
}

/// Writes `pool.txt` and `pool.json` into `dir` (created if missing).
pub fn write(p: &Pool, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let txt = dir.join("pool.txt");
    std::fs::write(&txt, table(p)).map_err(Error::io(format!("writing {}", txt.display())))?;
    let json = dir.join("pool.json");
    let text = serde_json::to_string_pretty(p).map_err(|e| Error::Usage(format!("pool.json: {e}")))?;
    std::fs::write(&json, text).map_err(Error::io(format!("writing {}", json.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real stored run (the calm command of 2026-12-06, 3 systems x 5
    /// repeats), read as the command reads it.
    fn stored() -> BenchReport {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/calm-light-kernel-2026-12-06n");
        report::read(&dir).unwrap()
    }

    /// `stored()` with every repeat's p50, p99 and p99.9 set to
    /// `f(system, repeat)` (µs).
    fn with_p99(f: impl Fn(&str, usize) -> u64) -> BenchReport {
        let mut r = stored();
        for s in &mut r.systems {
            let v = f(&s.name, s.repeat);
            (s.p50_us, s.p99_us, s.p999_us) = (v, v, v);
        }
        r
    }

    #[test]
    fn per_run_and_paired_ratios_are_what_the_repeats_say() {
        // Run 1: adaptive is 2x rocksdb in every repeat; run 2: 1x, except
        // repeat 5 where rocksdb is 10x slower (a stall of the baseline's).
        let a = with_p99(|n, i| match n {
            "paio-adaptive" => 200 + i as u64,
            "rocksdb" => 100 + i as u64 / 2,
            _ => 100,
        });
        let b = with_p99(|n, i| match (n, i) {
            ("rocksdb", 5) => 1000,
            _ => 100,
        });
        let runs = vec![(PathBuf::from("a"), a), (PathBuf::from("b"), b)];
        check_same_command(&runs).unwrap();
        let p = pool(&runs, "rocksdb", Some(1.1)).unwrap();
        let ad = p.systems.iter().find(|s| s.name == "paio-adaptive").unwrap();
        assert_eq!((ad.runs, ad.repeats), (2, 10));
        // Run 1: median 203 over median 101; run 2: 100 over 100.
        assert!((ad.run_p99_ratios[0] - 203.0 / 101.0).abs() < 1e-9, "{:?}", ad.run_p99_ratios);
        assert!((ad.run_p99_ratios[1] - 1.0).abs() < 1e-9);
        assert_eq!(ad.runs_within_target, Some(1));
        // Pairs: five near 2 (run 1), four of 1 and one of 0.1 (run 2): the
        // median is between the two groups' edges, (1 + 1.98..)/2.
        assert_eq!(ad.paired_p99.pairs, 10);
        let r1: Vec<f64> = (1..=5).map(|i| (200 + i) as f64 / (100 + i / 2) as f64).collect();
        let lowest_of_run1 = r1.iter().copied().fold(f64::INFINITY, f64::min);
        assert!((ad.paired_p99.median - (1.0 + lowest_of_run1) / 2.0).abs() < 1e-9, "{:?}", ad.paired_p99);
        // Two runs: no interval.
        assert_eq!(ad.paired_p99.interval, None);
        // Every quantile is paired on its own (here all three are alike).
        assert_eq!(ad.paired_p50, ad.paired_p99);
        assert_eq!(ad.paired_p999, ad.paired_p99);
        // Passthrough (100 throughout): 1.0, 0.99, 0.99, 0.98, 0.98 in run 1,
        // four of 1.0 and 0.1 in run 2: the median is (0.99.. + 1.0) / 2.
        let pt = p.systems.iter().find(|s| s.name == "paio-passthrough").unwrap();
        assert!((pt.paired_p99.median - (100.0 / 101.0 + 1.0) / 2.0).abs() < 1e-9, "{:?}", pt.paired_p99);
        assert!(p.systems.iter().all(|s| s.name != "rocksdb"), "the baseline is not listed against itself");
        let t = table(&p);
        assert!(t.contains("paio-adaptive") && t.contains("1/2") && t.contains("n=10"), "{t}");
    }

    #[test]
    fn the_interval_is_over_runs_and_repeatable() {
        // Four runs at 1.0, 1.1, 1.2, 1.3 (every repeat alike): the interval
        // lies within the runs' range and holds the median; the same runs
        // give the same interval.
        let runs: Vec<(PathBuf, BenchReport)> = [100u64, 110, 120, 130]
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                (PathBuf::from(format!("r{i}")), with_p99(move |n, _| if n == "paio-adaptive" { v } else { 100 }))
            })
            .collect();
        let p = pool(&runs, "rocksdb", None).unwrap();
        let ad = p.systems.iter().find(|s| s.name == "paio-adaptive").unwrap();
        let (lo, hi) = ad.paired_p99.interval.expect("4 runs: an interval");
        assert!((1.0..=1.3).contains(&lo) && (1.0..=1.3).contains(&hi) && lo < hi, "{lo} {hi}");
        assert!(lo <= ad.paired_p99.median && ad.paired_p99.median <= hi);
        assert!(lo < 1.1 && hi > 1.2, "a bootstrap over runs spans the runs' differences: {lo} {hi}");
        let again = pool(&runs, "rocksdb", None).unwrap();
        let ad_again = again.systems.iter().find(|s| s.name == "paio-adaptive").unwrap();
        assert_eq!(ad_again.paired_p99, ad.paired_p99);
        assert_eq!(ad.runs_within_target, None);
    }

    #[test]
    fn runs_of_different_commands_do_not_pool() {
        let a = stored();
        let mut b = stored();
        b.config["delete_piece"] = serde_json::json!(0);
        let runs = vec![(PathBuf::from("first"), a.clone()), (PathBuf::from("second"), b)];
        let e = check_same_command(&runs).unwrap_err().to_string();
        assert!(e.contains("second") && e.contains("config.delete_piece") && e.contains("1048576"), "{e}");
        let mut c = stored();
        c.profile = "constant 2000 ops/s".into();
        let e = check_same_command(&[(PathBuf::from("first"), a.clone()), (PathBuf::from("third"), c)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("third: profile is constant 2000 ops/s"), "{e}");
        // The load generator's own settings count too.
        let mut d = stored();
        for s in &mut d.systems {
            s.issue_lateness.as_mut().unwrap().timer_slack_ns = None;
        }
        let e = check_same_command(&[(PathBuf::from("first"), a.clone()), (PathBuf::from("old"), d)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("old: the clients' timer slack is not recorded") && e.contains("has 1 ns"), "{e}");
        let mut f = stored();
        for s in &mut f.systems {
            s.disk_probe = None;
        }
        let e = check_same_command(&[(PathBuf::from("first"), a.clone()), (PathBuf::from("unprobed"), f)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unprobed: the disk probe is off") && e.contains("every 20 ms"), "{e}");
        // A setting added later pools with runs from before it at the value
        // they had in effect, and with no other.
        let mut g = stored();
        g.config["adaptive"]["deep_at_floor"] = serde_json::json!(false);
        check_same_command(&[(PathBuf::from("first"), a.clone()), (PathBuf::from("newer"), g.clone())]).unwrap();
        check_same_command(&[(PathBuf::from("newer"), g.clone()), (PathBuf::from("first"), a.clone())]).unwrap();
        g.config["adaptive"]["deep_at_floor"] = serde_json::json!(true);
        let e = check_same_command(&[(PathBuf::from("first"), a.clone()), (PathBuf::from("floored"), g)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("floored: config.adaptive.deep_at_floor is true") && e.contains("has absent"), "{e}");
        let e = pool(&[(PathBuf::from("first"), a)], "paio-silk", None).unwrap_err().to_string();
        assert!(e.contains("first") && e.contains("paio-silk") && e.contains("paio-adaptive"), "{e}");
        let e = read_runs(&[]).unwrap_err().to_string();
        assert!(e.contains("results directories"), "{e}");
    }
}

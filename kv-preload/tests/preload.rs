//! The preload library under real programs: fio (Debian's package) at
//! io.max limits on several volumes at once, a live change read off fio's
//! per-second log, a program that dups and closes descriptors every way,
//! and bad rules files. Short runs (4 to 8 s): the 20 s figures and the
//! side-by-side with the kernel's throttle come from
//! `cargo run --release -p kv-preload --example fio_compare`.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{Job, Under, data_file, err_pct, run, scratch, volumes, write_rules};

const MIB: f64 = 1048576.0;

#[test]
fn fio_jobs_on_three_limited_volumes_and_an_unlimited_one() {
    let _one = support::serial();
    let dir = scratch();
    let d = dir.path();
    for v in ["r", "b", "u"] {
        data_file(&d.join(v).join("data"), 64);
    }
    std::fs::create_dir_all(d.join("w")).unwrap();
    let rules = d.join("rules.toml");
    write_rules(
        &rules,
        &volumes(&[
            ("w", &d.join("w"), "wbps=4MiB"),
            ("r", &d.join("r"), "riops=300"),
            ("b", &d.join("b"), "rbps=16MiB"),
            // A volume with no limit set: every key is max.
            ("u", &d.join("u"), ""),
        ]),
    );
    let jobs = [
        Job::new("w", &d.join("w/data"), "write", "4k", true),
        Job::new("r", &d.join("r/data"), "randread", "4k", true),
        Job::new("b", &d.join("b/data"), "read", "64k", true),
        // 4 KiB random reads from the page cache, as fast as they go.
        Job::new("u", &d.join("u/data"), "randread", "4k", false),
    ];
    let alone = run(&jobs[3..], Duration::from_secs(4), Under::Nothing, None);
    let got = run(&jobs, Duration::from_secs(4), Under::Preload(&rules), None);
    for m in &got {
        eprintln!(
            "{}: {:.0} B/s, {:.0} IOPS, clat p50 {:.0} us p99 {:.0} us",
            m.name, m.bw_bytes, m.iops, m.clat_p50_us, m.clat_p99_us
        );
    }
    eprintln!("u alone without the library: {:.0} IOPS", alone[0].iops);
    let e = [err_pct(got[0].bw_bytes, 4.0 * MIB), err_pct(got[1].iops, 300.0), err_pct(got[2].bw_bytes, 16.0 * MIB)];
    // 4 s runs: the 10 ms burst alone is 0.25% of them; 2% over leaves room
    // for fio's own start and stop. Below the limit is the disk's doing, not
    // the limiter's: a direct write that takes longer than the 10 ms burst
    // (a fresh CI machine writes back gigabytes of build output meanwhile)
    // lets tokens overflow, as the kernel's throttle also falls short on a
    // saturated device. 25% under still tells a wrong rate (half or double)
    // from the right one.
    for (name, e) in ["wbps", "riops", "rbps"].iter().zip(e) {
        assert!(e < 2.0 && e > -25.0, "{name}: {e:+.2}% off its limit");
    }
    // Unlimited: not throttled (a limit would hold it to a few thousand IOPS);
    // the 5% figure is measured by fio_compare over 20 s, not asserted on a
    // 2-core machine that runs three other fio processes meanwhile.
    assert!(got[3].iops > 0.6 * alone[0].iops, "u: {:.0} IOPS vs {:.0} alone", got[3].iops, alone[0].iops);
}

#[test]
fn a_limit_changes_live_while_fio_runs() {
    let _one = support::serial();
    // Built before the clock of the change starts.
    support::library();
    let dir = scratch();
    let d = dir.path();
    std::fs::create_dir_all(d.join("v")).unwrap();
    std::fs::create_dir_all(d.join("z")).unwrap();
    let rules = d.join("rules.toml");
    // `z` starts with no limit (its requests skip the stage) and gets one.
    write_rules(&rules, &volumes(&[("v", &d.join("v"), "wbps=4MiB"), ("z", &d.join("z"), "")]));
    let logs = d.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let jobs =
        [Job::new("v", &d.join("v/data"), "write", "4k", true), Job::new("z", &d.join("z/data"), "write", "4k", true)];
    // The change's clock starts once both fio job processes write: a fresh
    // CI machine saw the `sync` before fio take over 3.5 s, and later fio's
    // own set-up take about as long, so that the jobs started with the new
    // rules already in place.
    let mut changer = None;
    let got = support::run_with(&jobs, Duration::from_secs(9), Under::Preload(&rules), Some(&logs), |fio| {
        let (rules, v, z) = (rules.clone(), d.join("v"), d.join("z"));
        changer = Some(std::thread::spawn(move || {
            let began = support::wait_for_job_writes(fio, 2, 256 << 10, Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(2500));
            (began, support::write_rules_at(&rules, &volumes(&[("v", &v, "wbps=8MiB"), ("z", &z, "wbps=2MiB")])))
        }));
    });
    let (began, written) = changer.expect("fio started").join().unwrap();
    assert!(began, "fio's two jobs had not both written 256 KiB in 20 s");
    let (v, z) = (&got[0].per_second_kib, &got[1].per_second_kib);
    eprintln!("per second, KiB/s: v {v:?}, z {z:?}");
    // Each fio job process applied the change within one refill period of
    // 10 ms (the watcher's interval), plus scheduling delay on a busy
    // machine: well under 100 ms.
    let applied = support::applied_times(&got[0].stderr);
    assert!(applied.len() >= 2, "a reload per job process: {}", got[0].stderr);
    for t in applied {
        let lag_ms = (t - written) * 1e3;
        eprintln!("change applied {lag_ms:.1} ms after the file was written");
        assert!((0.0..100.0).contains(&lag_ms), "{lag_ms} ms");
    }
    assert!(v.len() >= 7 && z.len() >= 7, "{v:?} {z:?}");
    // The change lands 2.5 s after both jobs first write, which is about
    // when fio's clock starts (it has been seen to straddle seconds 2 and 3
    // of fio's log). So the change is found in
    // fio's own log: `c`, the first second in which `z` (unlimited before,
    // tens of MiB/s) writes at most twice its new 2 MiB/s; second `c - 1`
    // holds the change. Before it, `v` at 4 MiB/s; from `c + 1` on, 8 MiB/s
    // and `z` at 2 MiB/s. At most 5% over in any second; under, up to 25%
    // (the disk's doing, see above: `z` writes as fast as the disk goes
    // beside `v` until its limit).
    let near = |x: f64, want: f64| (-25.0..5.0).contains(&err_pct(x, want));
    let c = z.iter().position(|x| *x <= 2.0 * 2048.0).unwrap_or_else(|| panic!("z never limited: {z:?}"));
    assert!(c >= 2 && v.len() >= c + 3 && z.len() >= c + 3, "change in fio's second {c}: v {v:?}, z {z:?}");
    for (i, x) in v.iter().enumerate().take(c - 1) {
        assert!(near(*x, 4096.0), "v, second {}: {x} KiB/s, want 4096", i + 1);
    }
    for (i, x) in v.iter().enumerate().skip(c + 1).take(2) {
        assert!(near(*x, 8192.0), "v, second {}: {x} KiB/s, want 8192", i + 1);
    }
    assert!(z[..c - 1].iter().all(|x| *x > 2.0 * 2048.0), "z before its limit: {z:?}");
    for (i, x) in z.iter().enumerate().skip(c + 1).take(2) {
        assert!(near(*x, 2048.0), "z, second {}: {x} KiB/s, want 2048", i + 1);
    }
}

#[test]
fn limits_follow_descriptors_through_dup_close_fork_and_threads() {
    let _one = support::serial();
    let dir = scratch();
    let d = dir.path();
    let rules = d.join("rules.toml");
    write_rules(&rules, &volumes(&[("slow", &d.join("slow"), "wiops=20")]));
    let text = run_probe("fd_probe", d, &rules);
    assert!(text.contains("forked child, inherited limited fd"), "{text}");
}

/// Runs the example program `name` with `dir` under the library and
/// `rules`; returns its stdout, after checking it succeeded.
fn run_probe(name: &str, dir: &Path, rules: &Path) -> String {
    let probe = support::profile_dir().join("examples").join(name);
    let out = Command::new(&probe)
        .arg(dir)
        .env("LD_PRELOAD", support::library())
        .env("KVSDS_RULES", rules)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo builds examples with the tests)", probe.display()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name}: {}", out.status);
    text
}

#[test]
fn a_tagged_volume_gives_its_requests_a_context_other_rules_can_match() {
    let _one = support::serial();
    let dir = scratch();
    let d = dir.path();
    let rules = d.join("rules.toml");
    let mut text = String::from("contexts = [\"backup\"]\n\n");
    for (name, tag) in [("t", "tag = \"backup\"\n"), ("u", "")] {
        std::fs::create_dir_all(d.join(name)).unwrap();
        text += &format!("[[volumes]]\nname = \"{name}\"\npath = \"{}\"\n{tag}\n", d.join(name).display());
        // In each volume's channel, requests of the backup context meet 20 writes/s.
        text += &format!(
            "[[rules]]\nop = \"create_object\"\nchannel = \"{name}\"\nobject = \"slow\"\nspec = {{ kind = \"drl\", rate = \"20ops/s\" }}\nmatch = {{ context = \"backup\" }}\n\n"
        );
    }
    write_rules(&rules, &text);
    let lib = support::library();
    let dd = |name: &str| {
        let t = std::time::Instant::now();
        let out = Command::new("dd")
            .args(["if=/dev/zero", "bs=4k", "count=11", "oflag=direct"])
            .arg(format!("of={}", d.join(name).join("f").display()))
            .env("LD_PRELOAD", &lib)
            .env("KVSDS_RULES", &rules)
            .output()
            .unwrap();
        assert!(out.status.success(), "dd: {}", String::from_utf8_lossy(&out.stderr));
        t.elapsed()
    };
    let (tagged, plain) = (dd("t"), dd("u"));
    eprintln!("11 direct 4 KiB writes: tagged volume {tagged:?}, untagged {plain:?}");
    // 11 writes at 20/s take at least 0.5 s; untagged ones never meet the DRL.
    assert!(tagged >= Duration::from_millis(400), "{tagged:?}");
    assert!(plain < Duration::from_millis(400), "{plain:?}");
}

fn run_true(rules: &Path, passthrough: bool) -> (Option<i32>, String) {
    let mut cmd = Command::new("/bin/true");
    cmd.env("LD_PRELOAD", support::library()).env("KVSDS_RULES", rules);
    if passthrough {
        cmd.env("KVSDS_ON_ERROR", "passthrough");
    }
    let out = cmd.output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_bad_rules_file_stops_the_program_with_one_line_or_passes_through_when_asked() {
    let dir = scratch();
    let rules = dir.path().join("bad.toml");
    std::fs::write(&rules, "[[volumes]]\nname = \"db\"\npath = \"/srv/db\"\n\n[[volumes]]\nname = \"logs\"\npath = \"/srv/logs\"\nlimits = \"wbps=4MiB wiops=fast\"\n").unwrap();
    let (code, err) = run_true(&rules, false);
    assert_eq!(code, Some(78), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let want = format!("{}:5: field `limits`: wiops:", rules.display());
    assert!(err.contains(&want) && err.contains("not started"), "{err}");

    let (code, err) = run_true(&rules, true);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains(&want) && err.contains("WITHOUT limits"), "{err}");

    let (code, err) = run_true(&dir.path().join("missing.toml"), false);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("missing.toml"), "{err}");
}

/// Runs `program args` under the library with `rules`; returns how long it
/// took, after checking it succeeded.
fn timed_under(rules: &Path, program: &str, args: &[&std::ffi::OsStr]) -> Duration {
    let t = std::time::Instant::now();
    let out = Command::new(program)
        .args(args)
        .env("LD_PRELOAD", support::library())
        .env("KVSDS_RULES", rules)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let took = t.elapsed();
    assert!(out.status.success(), "{program} {args:?}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    took
}

#[test]
fn cp_and_dd_stay_within_the_limits_and_short_reads_cost_what_they_read() {
    let _one = support::serial();
    let dir = scratch();
    let d = dir.path();
    data_file(&d.join("slow/src"), 4);
    let rules = d.join("rules.toml");
    write_rules(&rules, &volumes(&[("slow", &d.join("slow"), "rbps=1MiB wbps=1MiB")]));
    // coreutils 9 cp copies with copy_file_range: refused on a limited
    // descriptor, it falls back to read and write, which are charged.
    // 4 MiB at 1 MiB/s each way: at least 3.5 s (the burst is 10 ms).
    let (src, dst) = (d.join("slow/src"), d.join("slow/dst"));
    let took = timed_under(&rules, "cp", &[src.as_os_str(), dst.as_os_str()]);
    eprintln!("cp of 4 MiB under rbps=wbps=1MiB: {took:?}");
    assert!(took >= Duration::from_millis(3500), "cp escaped the limit: {took:?}");
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap(), "cp's copy differs");
    // dd's 2 MiB reads of a 1-byte file: 1 byte each, not 2 MiB.
    std::fs::write(d.join("slow/one"), b"x").unwrap();
    let input = std::ffi::OsString::from(format!("if={}", d.join("slow/one").display()));
    let took = timed_under(&rules, "dd", &[&input, "of=/dev/null".as_ref(), "bs=2M".as_ref()]);
    eprintln!("dd bs=2M of a 1-byte file under rbps=1MiB: {took:?}");
    assert!(took < Duration::from_millis(1500), "a 1-byte file cost {took:?}");
    // And dd of the 4 MiB file is still limited.
    let input = std::ffi::OsString::from(format!("if={}", src.display()));
    let took = timed_under(&rules, "dd", &[&input, "of=/dev/null".as_ref(), "bs=1M".as_ref()]);
    assert!(took >= Duration::from_millis(3500), "dd read 4 MiB in {took:?}");
}

#[test]
fn no_escape_through_closed_descriptors_vfork_short_reads_kernel_copies_aio_or_a_later_directory() {
    let _one = support::serial();
    let dir = scratch();
    let d = dir.path();
    std::fs::create_dir_all(d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
    let rules = d.join("rules.toml");
    write_rules(
        &rules,
        &volumes(&[("slow", &d.join("slow"), "rbps=1MiB wbps=1MiB"), ("later", &d.join("link/later"), "wbps=1MiB")]),
    );
    let text = run_probe("escape_probe", d, &rules);
    assert!(text.contains("a file in a volume made after start"), "{text}");
}

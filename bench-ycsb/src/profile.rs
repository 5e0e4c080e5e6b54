//! Load profiles: the request rate over time that open-loop clients follow.
//!
//! * `constant:RATE`: a constant rate (ops/s);
//! * `silk:low=RATE,peak=RATE,valley=RATE,low-for=DUR,period=DUR`: SILK's
//!   shape: a low phase, then alternating peaks and valleys of half a period
//!   each (defaults: low-for 10s, period 20s, valley = low);
//! * `file:PATH`: a schedule file of `seconds rate` lines (rates hold until
//!   the next line's time; `#` comments);
//! * `steps:TIME=RATE,...`: the same schedule inline (`steps:0s=1000,10s=5000`);
//! * a name from [`NAMED`]: `paper` (the default), `light`, `write-peaks`,
//!   `longpeak`.

use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};

/// A request rate over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Profile {
    /// A constant rate.
    Constant {
        /// Operations per second.
        rate: f64,
    },
    /// SILK's shape.
    Silk {
        /// Rate of the low phase.
        low: f64,
        /// Length of the low phase, in seconds.
        low_for_s: f64,
        /// Rate of the peaks.
        peak: f64,
        /// Rate of the valleys.
        valley: f64,
        /// Length of one peak plus one valley, in seconds.
        period_s: f64,
    },
    /// A piecewise-constant schedule: `(from second, rate)`, sorted.
    Schedule {
        /// The steps.
        steps: Vec<(f64, f64)>,
    },
}

fn bad(spec: &str, msg: impl Into<String>) -> Error {
    Error::Profile { spec: spec.to_owned(), message: msg.into() }
}

fn rate(spec: &str, v: &str) -> Result<f64> {
    match v.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(bad(spec, format!("'{v}' is not a rate in ops/s"))),
    }
}

fn secs(spec: &str, v: &str) -> Result<f64> {
    kv_stage::units::parse_duration(v.trim())
        .map(|d| d.as_secs_f64())
        .map_err(|e| bad(spec, e.to_string()))
        .and_then(|s| if s > 0.0 { Ok(s) } else { Err(bad(spec, format!("'{v}' must be longer than zero"))) })
}

/// Named profiles: `(name, spec, what it is for)`.
pub const NAMED: &[(&str, &str, &str)] = &[
    (
        "paper",
        "silk:low=1000,peak=5000,valley=1000,low-for=10s,period=20s",
        "the default: SILK's shape, 10 s peaks of 5,000 ops/s",
    ),
    ("light", "constant:1000", "a light constant load with no compaction storm (use with --settle)"),
    (
        "write-peaks",
        "silk:low=1000,peak=10000,valley=1000,low-for=10s,period=20s",
        "peaks of 10,000 ops/s: with write-heavy, flushes and L0->L1 compactions need more than fixed thirds of KVS_B",
    ),
    (
        "longpeak",
        "steps:0s=6200,10s=26000,60s=6200,70s=26000",
        "SILK's db_bench longpeak shape (run 120s, with --workload longpeak): 10 s low, 50 s peak, 10 s low, 50 s peak",
    ),
];

impl Profile {
    /// Parses a profile spec (see the module documentation), or one of the
    /// [`NAMED`] profiles.
    pub fn parse(spec: &str) -> Result<Profile> {
        if let Some((_, named, _)) = NAMED.iter().find(|(n, _, _)| *n == spec.trim()) {
            return Profile::parse(named);
        }
        let (kind, args) = spec.split_once(':').unwrap_or((spec, ""));
        match kind {
            "constant" => Ok(Profile::Constant { rate: rate(spec, args)? }),
            "silk" => {
                let (mut low, mut peak, mut valley) = (None, None, None);
                let (mut low_for_s, mut period_s) = (10.0, 20.0);
                for kv in args.split(',').filter(|s| !s.trim().is_empty()) {
                    let (k, v) = kv.split_once('=').ok_or_else(|| bad(spec, format!("'{kv}' is not key=value")))?;
                    match k.trim() {
                        "low" => low = Some(rate(spec, v)?),
                        "peak" => peak = Some(rate(spec, v)?),
                        "valley" => valley = Some(rate(spec, v)?),
                        "low-for" => low_for_s = secs(spec, v)?,
                        "period" => period_s = secs(spec, v)?,
                        other => {
                            return Err(bad(
                                spec,
                                format!("unknown key '{other}' (low, peak, valley, low-for, period)"),
                            ));
                        }
                    }
                }
                let low = low.ok_or_else(|| bad(spec, "missing low=RATE"))?;
                let peak = peak.ok_or_else(|| bad(spec, "missing peak=RATE"))?;
                Ok(Profile::Silk { low, low_for_s, peak, valley: valley.unwrap_or(low), period_s })
            }
            "steps" => {
                let mut text = String::new();
                for step in args.split(',').filter(|s| !s.trim().is_empty()) {
                    let (t, r) = step.split_once('=').ok_or_else(|| bad(spec, format!("'{step}' is not TIME=RATE")))?;
                    let t = t.trim();
                    // A bare number is seconds; else a duration (`10s`, `500ms`).
                    let t = match t.parse::<f64>() {
                        Ok(x) => x,
                        Err(_) => kv_stage::units::parse_duration(t)
                            .map_err(|e| bad(spec, format!("'{t}': {e}")))?
                            .as_secs_f64(),
                    };
                    text.push_str(&format!("{t} {}\n", r.trim()));
                }
                Self::parse_schedule(spec, &text)
            }
            "file" => {
                let text =
                    std::fs::read_to_string(args).map_err(|e| bad(spec, format!("cannot read '{args}': {e}")))?;
                Self::parse_schedule(spec, &text)
            }
            _ => Err(bad(
                spec,
                format!(
                    "expected constant:RATE, silk:low=..,peak=.., steps:TIME=RATE,.., file:PATH, or a named profile ({})",
                    NAMED.iter().map(|n| n.0).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    /// Parses schedule text (`seconds rate` per line).
    pub fn parse_schedule(spec: &str, text: &str) -> Result<Profile> {
        let mut steps = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let l = line.split('#').next().unwrap_or("").trim();
            if l.is_empty() {
                continue;
            }
            let mut parts = l.split(|c: char| c.is_whitespace() || c == ',').filter(|p| !p.is_empty());
            let (Some(t), Some(r), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(spec, format!("line {}: expected `seconds rate`", n + 1)));
            };
            let t: f64 = t
                .parse()
                .ok()
                .filter(|t: &f64| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| bad(spec, format!("line {}: '{t}' is not a time in seconds", n + 1)))?;
            let r = rate(spec, r).map_err(|_| bad(spec, format!("line {}: '{r}' is not a rate", n + 1)))?;
            if steps.last().is_some_and(|&(p, _)| t <= p) {
                return Err(bad(spec, format!("line {}: times must increase", n + 1)));
            }
            steps.push((t, r));
        }
        if steps.is_empty() {
            return Err(bad(spec, "the schedule is empty"));
        }
        Ok(Profile::Schedule { steps })
    }

    /// The rate at `t` seconds.
    pub fn rate_at(&self, t: f64) -> f64 {
        match self {
            Profile::Constant { rate } => *rate,
            Profile::Silk { low, low_for_s, peak, valley, period_s } => {
                if t < *low_for_s {
                    *low
                } else if ((t - low_for_s) % period_s) < period_s / 2.0 {
                    *peak
                } else {
                    *valley
                }
            }
            Profile::Schedule { steps } => steps.iter().rev().find(|s| s.0 <= t).map_or(0.0, |s| s.1),
        }
    }

    /// The name of the phase at `t` seconds: `low`, `peak` or `valley` for
    /// SILK's shape, `constant`, or a schedule step's rate (`2000 ops/s`).
    pub fn phase_at(&self, t: f64) -> String {
        match self {
            Profile::Constant { .. } => "constant".into(),
            Profile::Silk { low_for_s, period_s, .. } => if t < *low_for_s {
                "low"
            } else if ((t - low_for_s) % period_s) < period_s / 2.0 {
                "peak"
            } else {
                "valley"
            }
            .into(),
            Profile::Schedule { .. } => format!("{:.0} ops/s", self.rate_at(t)),
        }
    }

    /// The highest rate (for sizing).
    pub fn max_rate(&self) -> f64 {
        match self {
            Profile::Constant { rate } => *rate,
            Profile::Silk { low, peak, valley, .. } => low.max(*peak).max(*valley),
            Profile::Schedule { steps } => steps.iter().map(|s| s.1).fold(0.0, f64::max),
        }
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        match self {
            Profile::Constant { rate } => format!("constant {rate:.0} ops/s"),
            Profile::Silk { low, low_for_s, peak, valley, period_s } => format!(
                "SILK-style: {low:.0} ops/s for {low_for_s:.0}s, then peaks of {peak:.0} and valleys of {valley:.0} ops/s, {:.0}s each",
                period_s / 2.0
            ),
            Profile::Schedule { steps } => {
                format!("schedule of {} steps, up to {:.0} ops/s", steps.len(), self.max_rate())
            }
        }
    }
}

/// Open-loop arrival times for one of `threads` clients: client `i` takes
/// every `threads`-th arrival of the whole profile, so the clients together
/// follow the profile and never wait for each other.
#[derive(Debug, Clone)]
pub struct Schedule {
    profile: Profile,
    threads: usize,
    /// Time (s) of this client's next arrival.
    next: f64,
}

impl Schedule {
    /// Client `index` of `threads`.
    pub fn new(profile: Profile, threads: usize, index: usize) -> Self {
        let threads = threads.max(1);
        let mut s = Schedule { profile, threads, next: 0.0 };
        // Stagger the clients by one arrival each.
        for _ in 0..index {
            s.next = s.advance(s.next, 1);
        }
        s
    }

    fn advance(&self, t: f64, arrivals: usize) -> f64 {
        let mut t = t;
        for _ in 0..arrivals {
            let r = self.profile.rate_at(t);
            if r <= 0.0 {
                // Idle: look for the next time the rate is positive.
                let mut probe = t;
                while self.profile.rate_at(probe) <= 0.0 && probe < t + 3600.0 {
                    probe += 0.01;
                }
                t = probe;
            } else {
                t += 1.0 / r;
            }
        }
        t
    }

    /// The next scheduled time, as a duration since the start.
    pub fn next_arrival(&mut self) -> Duration {
        let t = self.next;
        self.next = self.advance(t, self.threads);
        Duration::from_secs_f64(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_profiles() {
        assert_eq!(Profile::parse("constant:500").unwrap(), Profile::Constant { rate: 500.0 });
        let p = Profile::parse("silk:low=100,peak=1000,low-for=5s,period=4s").unwrap();
        assert_eq!(p.rate_at(1.0), 100.0);
        assert_eq!(p.rate_at(5.5), 1000.0);
        assert_eq!(p.rate_at(7.5), 100.0);
        assert_eq!(p.rate_at(9.5), 1000.0);
        assert!(Profile::parse("silk:peak=5").unwrap_err().to_string().contains("low"));
        assert!(Profile::parse("constant:-3").is_err());
        assert!(Profile::parse("sine:3").unwrap_err().to_string().contains("write-peaks"));
        assert_eq!(Profile::parse("light").unwrap(), Profile::Constant { rate: 1000.0 });
        for (name, spec, _) in NAMED {
            assert_eq!(Profile::parse(name).unwrap(), Profile::parse(spec).unwrap());
        }
        let s = Profile::parse_schedule("s", "0 10\n# x\n5 20\n").unwrap();
        assert_eq!((s.rate_at(4.9), s.rate_at(5.0)), (10.0, 20.0));
        assert!(Profile::parse_schedule("s", "5 1\n2 1\n").unwrap_err().to_string().contains("line 2"));
    }

    #[test]
    fn inline_steps_and_the_longpeak_shape() {
        let p = Profile::parse("steps:0=10,2.5=20,500ms=5").unwrap_err();
        assert!(p.to_string().contains("times must increase"), "{p}");
        let p = Profile::parse("steps:0s=10,2.5=20,3s=5").unwrap();
        assert_eq!((p.rate_at(0.0), p.rate_at(2.4), p.rate_at(2.5), p.rate_at(9.0)), (10.0, 10.0, 20.0, 5.0));
        assert!(Profile::parse("steps:10").unwrap_err().to_string().contains("TIME=RATE"));
        assert!(Profile::parse("steps:soon=10").unwrap_err().to_string().contains("soon"));
        // 10 s low, 50 s peak, 10 s low, 50 s peak.
        let lp = Profile::parse("longpeak").unwrap();
        let at = |t: f64| lp.rate_at(t);
        assert_eq!(
            (at(5.0), at(10.0), at(59.9), at(60.0), at(69.9), at(70.0), at(119.9)),
            (6200.0, 26000.0, 26000.0, 6200.0, 6200.0, 26000.0, 26000.0)
        );
    }

    #[test]
    fn clients_together_follow_the_profile() {
        let p = Profile::Constant { rate: 1000.0 };
        let mut all: Vec<f64> = Vec::new();
        for i in 0..4 {
            let mut s = Schedule::new(p.clone(), 4, i);
            loop {
                let t = s.next_arrival().as_secs_f64();
                if t >= 2.0 {
                    break;
                }
                all.push(t);
            }
        }
        // 1000 ops/s for 2 s, evenly spread.
        assert!((1995..=2005).contains(&all.len()), "{}", all.len());
        all.sort_by(f64::total_cmp);
        let gaps: Vec<f64> = all.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|g| (g - 0.001).abs() < 1e-6), "uneven arrivals");
    }
}

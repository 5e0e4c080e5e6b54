//! Prometheus metrics of stages, read at scrape time.
//!
//! [`StageMetrics`] is a [`Collector`] of the
//! [`prometheus-client`](prometheus_client) crate: register it once in a
//! registry and add every stage to it. Each scrape reads the stages' own
//! monotonic counters ([`Stage::collect`]) and their objects' current
//! settings; nothing is counted on the enforce path for it, and a stage
//! that is dropped simply stops appearing.
//!
//! ```
//! use std::sync::Arc;
//! use kv_stage::Stage;
//! use kv_stage::metrics::{StageMetrics, encode_text};
//! use prometheus_client::registry::Registry;
//!
//! let stage = Arc::new(Stage::new("db"));
//! let metrics = StageMetrics::new();
//! metrics.add(&stage);
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(metrics));
//! let text = encode_text(&registry);
//! assert!(text.contains("kvsds_stage_layout_generation{stage=\"db\"}"));
//! ```
//!
//! Every metric, its labels and meaning are listed in `docs/monitoring.md`.
//! Names follow Prometheus conventions: counters end in `_total`, values are
//! in base units (`_bytes`, `_seconds`), and labels are the stage, channel,
//! object, context and instance, never a per-thread or per-request value.

use std::sync::{Arc, Mutex, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeCounterValue, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::Stage;
use crate::iomax::Limit;
use crate::objects::{ObjectSpec, WaitHistogram};
use crate::stage::Collection;
use crate::units::RateUnit;

/// The stages one registry reports, read at every scrape (see the module
/// documentation). Cheap to clone: clones share the list.
#[derive(Clone, Default)]
pub struct StageMetrics {
    stages: Arc<Mutex<Vec<Weak<Stage>>>>,
}

impl std::fmt::Debug for StageMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageMetrics").field("stages", &self.live().len()).finish()
    }
}

impl StageMetrics {
    /// No stage yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports `stage` from the next scrape on, for as long as it lives (the
    /// list holds it weakly). Adding the same stage twice adds it once.
    pub fn add(&self, stage: &Arc<Stage>) {
        let mut v = self.stages.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        if !v.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(stage))) {
            v.push(Arc::downgrade(stage));
        }
    }

    /// Stops reporting `stage`.
    pub fn remove(&self, stage: &Arc<Stage>) {
        let mut v = self.stages.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(stage)));
    }

    fn live(&self) -> Vec<Arc<Stage>> {
        self.stages.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect()
    }
}

/// One stage as a scrape reads it.
struct Scrape {
    collection: Collection,
    specs: Vec<Option<ObjectSpec>>,
    instances: Vec<(crate::InstanceId, String)>,
}

impl Collector for StageMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let scrapes: Vec<Scrape> = self
            .live()
            .iter()
            .map(|s| {
                let (collection, specs, instances) = s.scrape();
                Scrape { collection, specs, instances }
            })
            .collect();
        let stage = |s: &Scrape| s.collection.stage.clone();

        family(
            &mut e,
            "kvsds_stage_layout_generation",
            "Layout generation: bumped by every structural change of the stage's rules.",
            MetricType::Gauge,
            |m| {
                for s in &scrapes {
                    gauge(m, &[("stage", stage(s))], s.collection.generation as f64)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_stage_instance_info",
            "An instance open on the stage (a RocksDB, a tenant's store), with who opened it.",
            MetricType::Gauge,
            |m| {
                for s in &scrapes {
                    for (id, owner) in &s.instances {
                        gauge(
                            m,
                            &[("stage", stage(s)), ("kv_instance", id.0.to_string()), ("owner", owner.clone())],
                            1.0,
                        )?;
                    }
                }
                Ok(())
            },
        )?;
        family(&mut e, "kvsds_channel_requests", "Requests admitted through the channel.", MetricType::Counter, |m| {
            for s in &scrapes {
                for c in &s.collection.channels {
                    counter(m, &[("stage", stage(s)), ("channel", c.channel.clone())], c.counter.ops)?;
                }
            }
            Ok(())
        })?;
        family(&mut e, "kvsds_channel_bytes", "Bytes admitted through the channel.", MetricType::Counter, |m| {
            for s in &scrapes {
                for c in &s.collection.channels {
                    counter(m, &[("stage", stage(s)), ("channel", c.channel.clone())], c.counter.bytes)?;
                }
            }
            Ok(())
        })?;
        let object_labels = |s: &Scrape, o: &crate::info::ObjectCounters| {
            [("stage", stage(s)), ("channel", o.channel.clone()), ("object", o.object.clone())]
        };
        family(
            &mut e,
            "kvsds_object_requests",
            "Requests the enforcement object admitted (restarts from 0 when the object is created again).",
            MetricType::Counter,
            |m| {
                for s in &scrapes {
                    for o in &s.collection.objects {
                        let [a, b, c] = object_labels(s, o);
                        counter(m, &[a, b, c, ("kind", o.kind.to_string())], o.counter.ops)?;
                    }
                }
                Ok(())
            },
        )?;
        family(&mut e, "kvsds_object_bytes", "Bytes the enforcement object admitted.", MetricType::Counter, |m| {
            for s in &scrapes {
                for o in &s.collection.objects {
                    let [a, b, c] = object_labels(s, o);
                    counter(m, &[a, b, c, ("kind", o.kind.to_string())], o.counter.bytes)?;
                }
            }
            Ok(())
        })?;
        family(
            &mut e,
            "kvsds_object_wait_seconds",
            "Time the requests that had to wait for tokens waited (requests admitted at once are not in it).",
            MetricType::Histogram,
            |m| {
                for s in &scrapes {
                    for o in &s.collection.objects {
                        histogram(m, &object_labels(s, o), o.stats.wait_ns as f64 * 1e-9, &o.stats.wait_histogram)?;
                    }
                }
                Ok(())
            },
        )?;
        family(&mut e, "kvsds_object_waiting", "Requests waiting in the object now.", MetricType::Gauge, |m| {
            for s in &scrapes {
                for o in &s.collection.objects {
                    gauge(m, &object_labels(s, o), o.stats.waiting as f64)?;
                }
            }
            Ok(())
        })?;
        for (name, help, want) in [
            (
                "kvsds_object_rate_bytes_per_second",
                "A DRL's configured rate, when it is limited and counted in bytes.",
                RateUnit::Bytes,
            ),
            (
                "kvsds_object_rate_ops_per_second",
                "A DRL's configured rate, when it is limited and counted in requests.",
                RateUnit::Ops,
            ),
        ] {
            family(&mut e, name, help, MetricType::Gauge, |m| {
                for s in &scrapes {
                    for (o, spec) in s.collection.objects.iter().zip(&s.specs) {
                        if let Some(ObjectSpec::Drl(d)) = spec
                            && !d.rate.is_unlimited()
                            && d.rate.unit() == want
                        {
                            gauge(m, &object_labels(s, o), d.rate.per_sec())?;
                        }
                    }
                }
                Ok(())
            })?;
        }
        for (name, help, bytes) in [
            ("kvsds_object_iomax_bytes_per_second", "A QoS object's io.max byte limit (rbps, wbps), when set.", true),
            (
                "kvsds_object_iomax_ops_per_second",
                "A QoS object's io.max request limit (riops, wiops), when set.",
                false,
            ),
        ] {
            family(&mut e, name, help, MetricType::Gauge, |m| {
                for s in &scrapes {
                    for (o, spec) in s.collection.objects.iter().zip(&s.specs) {
                        let Some(ObjectSpec::Qos(q)) = spec else { continue };
                        let (read, write) =
                            if bytes { (q.limits.rbps, q.limits.wbps) } else { (q.limits.riops, q.limits.wiops) };
                        for (direction, limit) in [("read", read), ("write", write)] {
                            if let Some(Limit::PerSec(n)) = limit {
                                let [a, b, c] = object_labels(s, o);
                                gauge(m, &[a, b, c, ("direction", direction.to_owned())], n as f64)?;
                            }
                        }
                    }
                }
                Ok(())
            })?;
        }
        let context_labels = |s: &Scrape, c: &crate::info::ContextCounters| {
            [("stage", stage(s)), ("context", c.context.name().to_owned())]
        };
        family(
            &mut e,
            "kvsds_context_requests",
            "Requests of the request context (file and key-value requests).",
            MetricType::Counter,
            |m| {
                for s in &scrapes {
                    for c in &s.collection.contexts {
                        counter(m, &context_labels(s, c), c.counter.ops)?;
                    }
                }
                Ok(())
            },
        )?;
        family(&mut e, "kvsds_context_bytes", "Bytes of the request context's requests.", MetricType::Counter, |m| {
            for s in &scrapes {
                for c in &s.collection.contexts {
                    counter(m, &context_labels(s, c), c.counter.bytes)?;
                }
            }
            Ok(())
        })?;
        family(
            &mut e,
            "kvsds_context_file_bytes",
            "Bytes the request context read or wrote in file contents (its device traffic).",
            MetricType::Counter,
            |m| {
                for s in &scrapes {
                    for c in &s.collection.contexts {
                        counter(m, &context_labels(s, c), c.file.bytes)?;
                    }
                }
                Ok(())
            },
        )?;
        let job_labels = |s: &Scrape, j: &crate::info::JobCounters| {
            [("stage", stage(s)), ("kv_instance", j.instance.0.to_string()), ("context", j.context.name().to_owned())]
        };
        family(
            &mut e,
            "kvsds_jobs_started",
            "Background jobs (flushes, compactions) that began, per context.",
            MetricType::Counter,
            |m| {
                for s in &scrapes {
                    for j in &s.collection.jobs {
                        counter(m, &job_labels(s, j), j.counts.begun)?;
                    }
                }
                Ok(())
            },
        )?;
        family(&mut e, "kvsds_jobs_finished", "Background jobs that ended, per context.", MetricType::Counter, |m| {
            for s in &scrapes {
                for j in &s.collection.jobs {
                    counter(m, &job_labels(s, j), j.counts.completed)?;
                }
            }
            Ok(())
        })?;
        family(&mut e, "kvsds_jobs_running", "Background jobs running now, per context.", MetricType::Gauge, |m| {
            for s in &scrapes {
                for j in &s.collection.jobs {
                    gauge(m, &job_labels(s, j), j.counts.running as f64)?;
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Writes one metric family: its descriptor, then what `samples` encodes.
/// A family without samples is still described (promtool and Prometheus
/// accept that), so the set of names does not depend on the traffic.
pub fn family(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl FnOnce(&mut prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    samples(&mut m)
}

/// One counter sample with its labels (a count, or seconds as `f64`).
pub fn counter<const N: usize, V: EncodeCounterValue + std::fmt::Debug>(
    m: &mut prometheus_client::encoding::MetricEncoder,
    labels: &[(&'static str, String); N],
    value: V,
) -> Result<(), std::fmt::Error> {
    ConstCounter::new(value).encode(m.encode_family(labels)?)
}

/// One gauge sample with its labels.
pub fn gauge<const N: usize>(
    m: &mut prometheus_client::encoding::MetricEncoder,
    labels: &[(&'static str, String); N],
    value: f64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(m.encode_family(labels)?)
}

/// One histogram sample (wait times) with its labels.
fn histogram<const N: usize>(
    m: &mut prometheus_client::encoding::MetricEncoder,
    labels: &[(&'static str, String); N],
    sum_seconds: f64,
    h: &WaitHistogram,
) -> Result<(), std::fmt::Error> {
    let count = h.0.iter().sum();
    m.encode_family(labels)?.encode_histogram::<NoLabelSet>(sum_seconds, count, &h.buckets(), None)
}

/// The registry's metrics in the Prometheus text format 0.0.4 (what
/// `promtool check metrics` reads, and Prometheus scrapes by default); an
/// encoding error (a collector's) gives what was written before it.
pub fn encode_text(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// The `Content-Type` of [`encode_text`]'s output.
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

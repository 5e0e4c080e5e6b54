//! YCSB workloads: property files, the core workloads A-F, and the Paio
//! paper's three mixtures.
//!
//! A property file is Java-properties text (`key=value`, `key: value`,
//! `#`/`!` comments). A bad value is an error naming the key; an unknown key
//! is a warning, as in YCSB.

use std::collections::BTreeMap;

use kv_stage::FieldError;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::generator::{Hotspot, Rng, ScrambledZipfian, Zipfian, key_name};

/// How keys are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestDistribution {
    /// Uniform over the loaded keys.
    Uniform,
    /// Scrambled zipfian (YCSB's `zipfian`).
    Zipfian,
    /// Skewed towards the most recently inserted keys.
    Latest,
    /// A hot fraction of the keys receives a hot fraction of the operations.
    Hotspot,
}

/// A length distribution (field lengths, scan lengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthDistribution {
    /// Always the maximum.
    Constant,
    /// Uniform between the minimum and the maximum.
    Uniform,
    /// Zipfian between the minimum and the maximum.
    Zipfian,
}

/// A YCSB core workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// Name (built-in name or file name).
    pub name: String,
    /// Records in the key space: what reads and updates choose among, and
    /// what the load phase writes unless `insertcount` says fewer.
    pub recordcount: u64,
    /// Records the load phase writes (YCSB's `insertcount`; `None`: all of
    /// `recordcount`). Fewer than `recordcount` makes a sparse key space:
    /// reads of the keys not loaded find nothing, updates create them, and
    /// neither counts as an error (SILK's `longpeak` starts from an empty DB
    /// so).
    pub insertcount: Option<u64>,
    /// Operations of a run (used only to size the zipfian key space, as in
    /// YCSB; runs here are bounded by time).
    pub operationcount: u64,
    /// Share of reads.
    pub readproportion: f64,
    /// Share of updates.
    pub updateproportion: f64,
    /// Share of inserts.
    pub insertproportion: f64,
    /// Share of scans.
    pub scanproportion: f64,
    /// Share of read-modify-writes.
    pub readmodifywriteproportion: f64,
    /// How keys are chosen.
    pub requestdistribution: RequestDistribution,
    /// Fields per record.
    pub fieldcount: u64,
    /// Bytes per field (the maximum for non-constant distributions).
    pub fieldlength: u64,
    /// How field lengths vary.
    pub fieldlengthdistribution: LengthDistribution,
    /// Shortest scan.
    pub minscanlength: u64,
    /// Longest scan.
    pub maxscanlength: u64,
    /// How scan lengths vary.
    pub scanlengthdistribution: LengthDistribution,
    /// `hashed` (default) or `ordered` key numbers.
    pub orderedinserts: bool,
    /// Digits keys are zero-padded to.
    pub zeropadding: usize,
    /// Hotspot: share of the keys that are hot.
    pub hotspotdatafraction: f64,
    /// Hotspot: share of the operations on hot keys.
    pub hotspotopnfraction: f64,
    /// Updates rewrite every field (else one).
    pub writeallfields: bool,
}

impl Default for Workload {
    /// YCSB's `CoreWorkload` defaults.
    fn default() -> Self {
        Workload {
            name: "default".into(),
            recordcount: 1000,
            insertcount: None,
            operationcount: 1000,
            readproportion: 0.95,
            updateproportion: 0.05,
            insertproportion: 0.0,
            scanproportion: 0.0,
            readmodifywriteproportion: 0.0,
            requestdistribution: RequestDistribution::Uniform,
            fieldcount: 10,
            fieldlength: 100,
            fieldlengthdistribution: LengthDistribution::Constant,
            minscanlength: 1,
            maxscanlength: 1000,
            scanlengthdistribution: LengthDistribution::Uniform,
            orderedinserts: false,
            zeropadding: 1,
            hotspotdatafraction: 0.2,
            hotspotopnfraction: 0.8,
            writeallfields: false,
        }
    }
}

/// Keys YCSB's client and other workloads define, accepted without a
/// warning and ignored here (the runner has its own options for them).
const IGNORED: &[&str] = &[
    "workload",
    "db",
    "table",
    "threadcount",
    "target",
    "measurementtype",
    "exporter",
    "exportfile",
    "readallfields",
    "readallfieldsbyname",
    "insertstart",
    "dataintegrity",
    "maxexecutiontime",
    "histogram.buckets",
    "status.interval",
    "core_workload_insertion_retry_limit",
    "core_workload_insertion_retry_interval",
    "fieldnameprefix",
];

/// The built-in workload names.
pub const BUILTIN: &[&str] = &["a", "b", "c", "d", "e", "f", "mixture", "read-heavy", "write-heavy", "longpeak"];

/// The key space of the built-in `longpeak` workload: db_bench's `--num` in
/// SILK's recipe (`../shared/peers/silk/run_silk.sh`).
pub const LONGPEAK_KEYS: u64 = 5_000_000;

fn parse_properties(text: &str) -> BTreeMap<String, (usize, String)> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with('!') {
            continue;
        }
        let (k, v) = match l.find(['=', ':']) {
            Some(i) => (l[..i].trim(), l[i + 1..].trim()),
            None => (l, ""),
        };
        out.insert(k.to_owned(), (n + 1, v.to_owned()));
    }
    out
}

impl Workload {
    /// A built-in workload: YCSB's core workloads `a`-`f` (also
    /// `workloada`...), and the Paio paper's `mixture` (50% reads, 50%
    /// updates), `read-heavy` (90/10) and `write-heavy` (10/90), all with
    /// zipfian keys; and `longpeak`, shaped like SILK's db_bench test of that
    /// name: 50% gets and 50% puts of whole 1 KB records, uniform over
    /// [`LONGPEAK_KEYS`] keys of which none is loaded (an empty DB: most gets
    /// miss, most puts insert).
    pub fn builtin(name: &str) -> Option<Workload> {
        let short = name.strip_prefix("workload").unwrap_or(name);
        let base = Workload {
            name: name.to_owned(),
            requestdistribution: RequestDistribution::Zipfian,
            ..Workload::default()
        };
        let mix = |read: f64, update: f64| Workload { readproportion: read, updateproportion: update, ..base.clone() };
        Some(match short {
            "a" => mix(0.5, 0.5),
            "b" => mix(0.95, 0.05),
            "c" => mix(1.0, 0.0),
            "d" => Workload {
                readproportion: 0.95,
                updateproportion: 0.0,
                insertproportion: 0.05,
                requestdistribution: RequestDistribution::Latest,
                ..base
            },
            "e" => Workload {
                readproportion: 0.0,
                updateproportion: 0.0,
                scanproportion: 0.95,
                insertproportion: 0.05,
                maxscanlength: 100,
                scanlengthdistribution: LengthDistribution::Uniform,
                ..base
            },
            "f" => Workload { readproportion: 0.5, updateproportion: 0.0, readmodifywriteproportion: 0.5, ..base },
            "mixture" => mix(0.5, 0.5),
            "read-heavy" | "readheavy" => mix(0.9, 0.1),
            "write-heavy" | "writeheavy" => mix(0.1, 0.9),
            "longpeak" => Workload {
                recordcount: LONGPEAK_KEYS,
                insertcount: Some(0),
                requestdistribution: RequestDistribution::Uniform,
                writeallfields: true,
                ..mix(0.5, 0.5)
            },
            _ => return None,
        })
    }

    /// Parses YCSB properties over YCSB's defaults. Returns the workload and
    /// warnings (unknown keys).
    pub fn from_properties(name: &str, text: &str) -> Result<(Workload, Vec<String>)> {
        let props = parse_properties(text);
        let mut w = Workload { name: name.to_owned(), ..Workload::default() };
        let mut warnings = Vec::new();
        let bad = |key: &str, line: usize, value: &str, what: &str| {
            Error::Workload(FieldError::new(key, format!("line {line}: '{value}' is not {what}")))
        };
        let int = |key: &str, (line, v): &(usize, String)| -> Result<u64> {
            v.parse::<u64>().map_err(|_| bad(key, *line, v, "a non-negative integer"))
        };
        let prop = |key: &str, (line, v): &(usize, String)| -> Result<f64> {
            match v.parse::<f64>() {
                Ok(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(x),
                _ => Err(bad(key, *line, v, "a proportion between 0 and 1")),
            }
        };
        let boolean = |key: &str, (line, v): &(usize, String)| -> Result<bool> {
            v.parse::<bool>().map_err(|_| bad(key, *line, v, "true or false"))
        };
        let length = |key: &str, (line, v): &(usize, String)| -> Result<LengthDistribution> {
            match v.as_str() {
                "constant" => Ok(LengthDistribution::Constant),
                "uniform" => Ok(LengthDistribution::Uniform),
                "zipfian" => Ok(LengthDistribution::Zipfian),
                _ => Err(bad(key, *line, v, "constant, uniform or zipfian")),
            }
        };
        for (key, value) in &props {
            match key.as_str() {
                "recordcount" => w.recordcount = int(key, value)?,
                "insertcount" => w.insertcount = Some(int(key, value)?),
                "operationcount" => w.operationcount = int(key, value)?,
                "readproportion" => w.readproportion = prop(key, value)?,
                "updateproportion" => w.updateproportion = prop(key, value)?,
                "insertproportion" => w.insertproportion = prop(key, value)?,
                "scanproportion" => w.scanproportion = prop(key, value)?,
                "readmodifywriteproportion" => w.readmodifywriteproportion = prop(key, value)?,
                "requestdistribution" => {
                    w.requestdistribution = match value.1.as_str() {
                        "uniform" => RequestDistribution::Uniform,
                        "zipfian" => RequestDistribution::Zipfian,
                        "latest" => RequestDistribution::Latest,
                        "hotspot" => RequestDistribution::Hotspot,
                        _ => return Err(bad(key, value.0, &value.1, "uniform, zipfian, latest or hotspot")),
                    }
                }
                "fieldcount" => w.fieldcount = int(key, value)?,
                "fieldlength" => w.fieldlength = int(key, value)?,
                "fieldlengthdistribution" => w.fieldlengthdistribution = length(key, value)?,
                "minscanlength" => w.minscanlength = int(key, value)?,
                "maxscanlength" => w.maxscanlength = int(key, value)?,
                "scanlengthdistribution" => {
                    w.scanlengthdistribution = match length(key, value)? {
                        LengthDistribution::Constant => {
                            return Err(bad(key, value.0, &value.1, "uniform or zipfian"));
                        }
                        d => d,
                    }
                }
                "insertorder" => {
                    w.orderedinserts = match value.1.as_str() {
                        "hashed" => false,
                        "ordered" => true,
                        _ => return Err(bad(key, value.0, &value.1, "hashed or ordered")),
                    }
                }
                "zeropadding" => w.zeropadding = int(key, value)?.clamp(1, 30) as usize,
                "hotspotdatafraction" => w.hotspotdatafraction = prop(key, value)?,
                "hotspotopnfraction" => w.hotspotopnfraction = prop(key, value)?,
                "writeallfields" => w.writeallfields = boolean(key, value)?,
                k if IGNORED.contains(&k) => {}
                k => warnings.push(format!("line {}: unknown property '{k}' ignored", value.0)),
            }
        }
        w.validate()?;
        Ok((w, warnings))
    }

    /// Loads a built-in by name, or a property file.
    pub fn load(name_or_path: &str) -> Result<(Workload, Vec<String>)> {
        if let Some(w) = Self::builtin(name_or_path) {
            return Ok((w, Vec::new()));
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| {
            Error::Workload(FieldError::new(
                "workload",
                format!(
                    "'{name_or_path}' is neither a built-in workload ({}) nor a readable file: {e}",
                    BUILTIN.join(", ")
                ),
            ))
        })?;
        let name = std::path::Path::new(name_or_path).file_name().map_or(name_or_path.into(), |n| n.to_string_lossy());
        Self::from_properties(&name, &text)
    }

    /// Checks the values together.
    pub fn validate(&self) -> Result<()> {
        let err = |key: &str, m: String| Err(Error::Workload(FieldError::new(key, m)));
        let total = self.readproportion
            + self.updateproportion
            + self.insertproportion
            + self.scanproportion
            + self.readmodifywriteproportion;
        if total <= 0.0 {
            return err("readproportion", "all operation proportions are 0".into());
        }
        if self.recordcount == 0 {
            return err("recordcount", "must be at least 1".into());
        }
        if let Some(n) = self.insertcount.filter(|n| *n > self.recordcount) {
            return err("insertcount", format!("{n} is more than recordcount ({})", self.recordcount));
        }
        if self.fieldcount == 0 {
            return err("fieldcount", "must be at least 1".into());
        }
        if self.fieldlength == 0 {
            return err("fieldlength", "must be at least 1".into());
        }
        if self.minscanlength == 0 || self.minscanlength > self.maxscanlength {
            return err("minscanlength", format!("must be between 1 and maxscanlength ({})", self.maxscanlength));
        }
        Ok(())
    }

    /// Records the load phase writes.
    pub fn loaded(&self) -> u64 {
        self.insertcount.unwrap_or(self.recordcount)
    }

    /// Whether key number `k` exists once loaded: a loaded key, or one a
    /// run inserts (numbered from `recordcount` on).
    pub fn must_exist(&self, k: u64) -> bool {
        k < self.loaded() || k >= self.recordcount
    }

    /// Bytes of one record (for constant field lengths).
    pub fn record_bytes(&self) -> u64 {
        self.fieldcount * self.fieldlength
    }
}

/// One operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Op {
    /// Point read.
    Read,
    /// Update one (or every) field.
    Update,
    /// Insert a new record.
    Insert,
    /// Range scan.
    Scan,
    /// Read, then update.
    ReadModifyWrite,
}

impl Op {
    /// Every kind.
    pub const ALL: [Op; 5] = [Op::Read, Op::Update, Op::Insert, Op::Scan, Op::ReadModifyWrite];

    /// YCSB's label.
    pub fn label(self) -> &'static str {
        match self {
            Op::Read => "READ",
            Op::Update => "UPDATE",
            Op::Insert => "INSERT",
            Op::Scan => "SCAN",
            Op::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

/// Chooses operations and keys for one client thread.
#[derive(Debug, Clone)]
pub struct OpChooser {
    cumulative: Vec<(f64, Op)>,
    keys: KeyChooser,
    fields: u64,
    scan: (u64, u64, LengthDistribution),
    scan_zipf: Option<Zipfian>,
    ordered: bool,
    zeropadding: usize,
}

#[derive(Debug, Clone)]
enum KeyChooser {
    Uniform(u64),
    Zipfian(ScrambledZipfian),
    Latest(Zipfian),
    Hotspot(Hotspot),
}

/// A chosen operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// The kind.
    pub op: Op,
    /// Its key number (for inserts, the number to insert).
    pub keynum: u64,
    /// Field index to update or read.
    pub field: u64,
    /// Records to scan.
    pub scan_len: u64,
}

impl OpChooser {
    /// A chooser for `w`, over the `recordcount` loaded keys.
    pub fn new(w: &Workload) -> Self {
        let mut cumulative = Vec::new();
        let mut acc = 0.0;
        for (p, op) in [
            (w.readproportion, Op::Read),
            (w.updateproportion, Op::Update),
            (w.insertproportion, Op::Insert),
            (w.scanproportion, Op::Scan),
            (w.readmodifywriteproportion, Op::ReadModifyWrite),
        ] {
            if p > 0.0 {
                acc += p;
                cumulative.push((acc, op));
            }
        }
        for c in &mut cumulative {
            c.0 /= acc;
        }
        let n = w.recordcount;
        let keys = match w.requestdistribution {
            RequestDistribution::Uniform => KeyChooser::Uniform(n),
            RequestDistribution::Zipfian => {
                // As YCSB: leave room for the keys inserts will add.
                let expected_new = (w.operationcount as f64 * w.insertproportion * 2.0) as u64;
                KeyChooser::Zipfian(ScrambledZipfian::new(0, n + expected_new))
            }
            RequestDistribution::Latest => KeyChooser::Latest(Zipfian::new(0, n.max(2) - 1)),
            RequestDistribution::Hotspot => {
                KeyChooser::Hotspot(Hotspot::new(0, n - 1, w.hotspotdatafraction, w.hotspotopnfraction))
            }
        };
        let scan_zipf = (w.scanlengthdistribution == LengthDistribution::Zipfian)
            .then(|| Zipfian::new(w.minscanlength, w.maxscanlength));
        OpChooser {
            cumulative,
            keys,
            fields: w.fieldcount,
            scan: (w.minscanlength, w.maxscanlength, w.scanlengthdistribution),
            scan_zipf,
            ordered: w.orderedinserts,
            zeropadding: w.zeropadding,
        }
    }

    /// The key name of a key number.
    pub fn key(&self, keynum: u64) -> String {
        key_name(keynum, self.zeropadding, self.ordered)
    }

    /// Chooses the next operation. `inserted` is the number of keys that
    /// exist (loaded plus inserted so far); `next_insert` hands out the
    /// number of a new key.
    pub fn next(&mut self, rng: &mut Rng, inserted: u64, next_insert: impl FnOnce() -> u64) -> Chosen {
        let u = rng.next_f64();
        let op =
            self.cumulative.iter().find(|c| u < c.0).map_or(self.cumulative.last().map_or(Op::Read, |c| c.1), |c| c.1);
        let keynum = if op == Op::Insert {
            next_insert()
        } else {
            loop {
                let k = match &mut self.keys {
                    KeyChooser::Uniform(n) => rng.below(*n),
                    KeyChooser::Zipfian(z) => z.next(rng),
                    KeyChooser::Latest(z) => {
                        let max = inserted.max(1) - 1;
                        max - z.next_of(rng, max.max(1)).min(max)
                    }
                    KeyChooser::Hotspot(h) => h.next(rng),
                };
                // As YCSB: skip keys not inserted yet.
                if k < inserted.max(1) {
                    break k;
                }
            }
        };
        let scan_len = match (op, self.scan.2) {
            (Op::Scan, LengthDistribution::Zipfian) => self.scan_zipf.as_ref().map_or(self.scan.0, |z| z.next(rng)),
            (Op::Scan, _) => self.scan.0 + rng.below(self.scan.1 - self.scan.0 + 1),
            _ => 0,
        };
        Chosen { op, keynum, field: rng.below(self.fields), scan_len }
    }
}

/// Builds record values: `fieldcount` fields of `fieldlength` bytes, stored
/// as one value (`field<i>=` followed by the bytes, per field).
#[derive(Debug, Clone)]
pub struct RecordBuilder {
    fieldcount: u64,
    fieldlength: u64,
    lengths: LengthDistribution,
    /// Updates rewrite every field (`writeallfields`).
    all_fields: bool,
    /// Zipfian lengths `1..=fieldlength`, the shortest the most popular
    /// (YCSB's `ZipfianGenerator(1, fieldlength)`).
    zipf: Option<Zipfian>,
}

impl RecordBuilder {
    /// For a workload.
    pub fn new(w: &Workload) -> Self {
        RecordBuilder {
            fieldcount: w.fieldcount,
            fieldlength: w.fieldlength,
            lengths: w.fieldlengthdistribution,
            all_fields: w.writeallfields,
            zipf: (w.fieldlengthdistribution == LengthDistribution::Zipfian && w.fieldlength > 1)
                .then(|| Zipfian::new(1, w.fieldlength)),
        }
    }

    /// Whether an update rewrites every field (so the old record is not
    /// needed).
    pub fn writes_all_fields(&self) -> bool {
        self.all_fields
    }

    fn field_len(&self, rng: &mut Rng) -> usize {
        match self.lengths {
            LengthDistribution::Constant => self.fieldlength as usize,
            LengthDistribution::Uniform => 1 + rng.below(self.fieldlength) as usize,
            LengthDistribution::Zipfian => self.zipf.as_ref().map_or(1, |z| z.next(rng).min(self.fieldlength) as usize),
        }
    }

    fn fill(rng: &mut Rng, out: &mut Vec<u8>, len: usize) {
        // Printable random bytes, as YCSB's RandomByteIterator.
        let start = out.len();
        out.resize(start + len, 0);
        for b in &mut out[start..] {
            *b = b' ' + (rng.next_u64() % 95) as u8;
        }
    }

    /// A whole record.
    pub fn record(&self, rng: &mut Rng, out: &mut Vec<u8>) {
        out.clear();
        for i in 0..self.fieldcount {
            out.extend_from_slice(format!("field{i}=").as_bytes());
            let n = self.field_len(rng);
            Self::fill(rng, out, n);
            out.push(0);
        }
    }

    /// The record with field `field` replaced (others kept), as YCSB's
    /// RocksDB binding does for updates (read, merge, write).
    pub fn update(&self, rng: &mut Rng, existing: &[u8], field: u64, out: &mut Vec<u8>) {
        out.clear();
        let prefix = format!("field{field}=");
        let mut replaced = false;
        for part in existing.split(|&b| b == 0).filter(|p| !p.is_empty()) {
            if part.starts_with(prefix.as_bytes()) {
                out.extend_from_slice(prefix.as_bytes());
                let n = self.field_len(rng);
                Self::fill(rng, out, n);
                replaced = true;
            } else {
                out.extend_from_slice(part);
            }
            out.push(0);
        }
        if !replaced {
            out.extend_from_slice(prefix.as_bytes());
            let n = self.field_len(rng);
            Self::fill(rng, out, n);
            out.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_match_ycsb() {
        let a = Workload::builtin("workloada").unwrap();
        assert_eq!((a.readproportion, a.updateproportion), (0.5, 0.5));
        assert_eq!(a.requestdistribution, RequestDistribution::Zipfian);
        let d = Workload::builtin("d").unwrap();
        assert_eq!(d.requestdistribution, RequestDistribution::Latest);
        let e = Workload::builtin("e").unwrap();
        assert_eq!((e.scanproportion, e.maxscanlength), (0.95, 100));
        let wh = Workload::builtin("write-heavy").unwrap();
        assert_eq!((wh.readproportion, wh.updateproportion), (0.1, 0.9));
        assert_eq!(a.record_bytes(), 1000);
        for b in BUILTIN {
            Workload::builtin(b).unwrap().validate().unwrap();
        }
    }

    #[test]
    fn property_files_parse_and_name_bad_keys() {
        let (w, warn) = Workload::from_properties(
            "w",
            "# comment\nrecordcount=5000\noperationcount : 100\nreadproportion=0.7\nupdateproportion=0.3\n\
             requestdistribution=hotspot\nworkload=site.ycsb.workloads.CoreWorkload\nfancyoption=1\n",
        )
        .unwrap();
        assert_eq!(w.recordcount, 5000);
        assert_eq!(w.operationcount, 100);
        assert_eq!(w.requestdistribution, RequestDistribution::Hotspot);
        assert_eq!(warn.len(), 1);
        assert!(warn[0].contains("fancyoption"));
        for (text, key) in [
            ("recordcount=lots\n", "recordcount"),
            ("readproportion=1.5\n", "readproportion"),
            ("requestdistribution=gaussian\n", "requestdistribution"),
            ("insertorder=random\n", "insertorder"),
            ("readproportion=0\nupdateproportion=0\n", "readproportion"),
            ("minscanlength=10\nmaxscanlength=5\n", "minscanlength"),
        ] {
            let e = Workload::from_properties("w", text).unwrap_err();
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn chooser_follows_proportions_and_bounds() {
        let w = Workload { recordcount: 1000, ..Workload::builtin("mixture").unwrap() };
        let mut c = OpChooser::new(&w);
        let mut rng = Rng::new(1);
        let mut reads = 0;
        for _ in 0..100_000 {
            let x = c.next(&mut rng, 1000, || unreachable!("no inserts"));
            assert!(x.keynum < 1000);
            if x.op == Op::Read {
                reads += 1;
            }
        }
        assert!((49_000..51_000).contains(&reads), "{reads}");
    }

    #[test]
    fn longpeak_is_an_empty_db_over_five_million_keys() {
        let w = Workload::builtin("longpeak").unwrap();
        assert_eq!((w.recordcount, w.loaded(), w.readproportion, w.updateproportion), (LONGPEAK_KEYS, 0, 0.5, 0.5));
        assert_eq!(w.record_bytes(), 1000);
        // Nothing loaded: no key must exist, but one a run inserts does.
        assert!(!w.must_exist(0) && !w.must_exist(LONGPEAK_KEYS - 1) && w.must_exist(LONGPEAK_KEYS));
        assert!(RecordBuilder::new(&w).writes_all_fields());
        // The other built-ins load every key.
        let m = Workload::builtin("mixture").unwrap();
        assert!(m.insertcount.is_none() && m.must_exist(m.recordcount - 1));
        let (f, _) = Workload::from_properties("f", "recordcount=100\ninsertcount=10\n").unwrap();
        assert_eq!(f.loaded(), 10);
        let e = Workload::from_properties("f", "recordcount=100\ninsertcount=101\n").unwrap_err().to_string();
        assert!(e.contains("insertcount") && e.contains("more than recordcount"), "{e}");
    }

    #[test]
    fn updates_replace_one_field() {
        let w = Workload::default();
        let b = RecordBuilder::new(&w);
        let mut rng = Rng::new(3);
        let mut rec = Vec::new();
        b.record(&mut rng, &mut rec);
        assert_eq!(rec.len(), 10 * (100 + 1) + (0..10).map(|i| format!("field{i}=").len()).sum::<usize>());
        let mut upd = Vec::new();
        b.update(&mut rng, &rec, 3, &mut upd);
        assert_eq!(upd.len(), rec.len());
        let fields = |r: &[u8]| r.split(|&x| x == 0).filter(|p| !p.is_empty()).map(<[u8]>::to_vec).collect::<Vec<_>>();
        let (a, bb) = (fields(&rec), fields(&upd));
        assert_eq!(a.len(), 10);
        for i in 0..10 {
            assert_eq!(a[i] == bb[i], i != 3, "field {i}");
        }
    }
}

//! Fair-share policies against simulated flows on a simulated device: each
//! cycle every flow offers `min(desire, limit)`, and when the offers exceed
//! the device they are scaled down in proportion (a FIFO device serves load
//! in proportion to what is offered). Pure Rust, no sleeping.

use controller::{FairShare, FairShareMode, FlowInput, water_fill};

const MIB: f64 = 1048576.0;
const DEVICE: f64 = 1024.0 * MIB;

/// The max-min share of flows with true `desires`: demands first (up to the
/// fair share), then the leftover to flows that want more.
fn max_min_share(demands: &[f64], desires: &[f64]) -> Vec<f64> {
    let first: Vec<f64> = demands.iter().zip(desires).map(|(d, w)| d.min(*w)).collect();
    let first = water_fill(DEVICE, &first);
    let left = DEVICE - first.iter().sum::<f64>();
    let more: Vec<f64> = desires.iter().zip(&first).map(|(w, a)| (w - a).max(0.0)).collect();
    let second = water_fill(left, &more);
    first.iter().zip(&second).map(|(a, b)| a + b).collect()
}

struct Sim {
    policy: FairShare,
    demands: Vec<f64>,
    desires: Vec<f64>,
    limits: Vec<Option<f64>>,
    usage: Vec<f64>,
}

impl Sim {
    fn new(mode: FairShareMode, demands: &[f64], desires: &[f64]) -> Self {
        Sim {
            policy: FairShare::new(mode, DEVICE, Vec::new()),
            demands: demands.to_vec(),
            desires: desires.to_vec(),
            limits: vec![None; demands.len()],
            usage: vec![0.0; demands.len()],
        }
    }

    /// One control cycle, then one interval of the device.
    fn step(&mut self) {
        let inputs: Vec<FlowInput> = (0..self.demands.len())
            .map(|i| FlowInput { demand: self.demands[i], usage: self.usage[i], limit: self.limits[i] })
            .collect();
        let limits = self.policy.allocate(&inputs);
        let offered: Vec<f64> = self.desires.iter().zip(&limits).map(|(d, l)| d.min(*l)).collect();
        let total: f64 = offered.iter().sum();
        let scale = if total > DEVICE { DEVICE / total } else { 1.0 };
        self.usage = offered.iter().map(|o| o * scale).collect();
        self.limits = limits.into_iter().map(Some).collect();
    }

    fn remove(&mut self, i: usize) {
        for v in [&mut self.demands, &mut self.desires, &mut self.usage] {
            v.remove(i);
        }
        self.limits.remove(i);
    }

    fn add(&mut self, demand: f64, desire: f64) {
        self.demands.push(demand);
        self.desires.push(desire);
        self.usage.push(0.0);
        self.limits.push(None);
    }

    /// Cycles until every flow is within 5% of its max-min share (or None).
    fn converge(&mut self, max_cycles: usize) -> Option<usize> {
        let share = max_min_share(&self.demands, &self.desires);
        for c in 1..=max_cycles {
            self.step();
            if self.usage.iter().zip(&share).all(|(u, s)| (u - s).abs() <= 0.05 * s) {
                return Some(c);
            }
        }
        None
    }

    fn utilisation(&self) -> f64 {
        self.usage.iter().sum::<f64>() / DEVICE
    }
}

/// The paper's scenario shape: four instances that each ask for a quarter
/// of the device; two want less than that, two want more.
const DEMANDS: [f64; 4] = [256.0 * MIB; 4];
const DESIRES: [f64; 4] = [100.0 * MIB, 150.0 * MIB, 421.0 * MIB, 600.0 * MIB];

#[test]
fn max_min_converges_within_ten_cycles_and_uses_the_device() {
    let mut sim = Sim::new(FairShareMode::MaxMin, &DEMANDS, &DESIRES);
    let cycles = sim.converge(10).expect("max-min did not converge within 10 cycles");
    eprintln!("max-min: converged in {cycles} cycles, utilisation {:.1}%", sim.utilisation() * 100.0);
    // Total desire (1271 MiB/s) exceeds the device: it must stay busy.
    for _ in 0..20 {
        sim.step();
        assert!(sim.utilisation() >= 0.95, "utilisation {:.3}", sim.utilisation());
    }

    // One leaves: the rest re-converge and still fill the device.
    sim.remove(0);
    let cycles = sim.converge(10).expect("no convergence after a leave");
    eprintln!("max-min: after a leave, converged in {cycles} cycles, utilisation {:.1}%", sim.utilisation() * 100.0);
    assert!(sim.utilisation() >= 0.95);

    // One joins, asking for a quarter and wanting more.
    sim.add(256.0 * MIB, 500.0 * MIB);
    let cycles = sim.converge(10).expect("no convergence after a join");
    eprintln!("max-min: after a join, converged in {cycles} cycles, utilisation {:.1}%", sim.utilisation() * 100.0);
    assert!(sim.utilisation() >= 0.95);
}

#[test]
fn static_limits_leave_bandwidth_unused_where_max_min_does_not() {
    let mut fixed = Sim::new(FairShareMode::Static, &DEMANDS, &DESIRES);
    let mut fair = Sim::new(FairShareMode::MaxMin, &DEMANDS, &DESIRES);
    for _ in 0..10 {
        fixed.step();
        fair.step();
    }
    eprintln!(
        "utilisation after 10 cycles: static {:.1}%, max-min {:.1}%",
        fixed.utilisation() * 100.0,
        fair.utilisation() * 100.0
    );
    // Static: 100 + 150 + 256 + 256 = 762 of 1024 MiB/s.
    assert!(fixed.utilisation() < 0.80, "static {:.3}", fixed.utilisation());
    assert!(fair.utilisation() >= 0.95, "max-min {:.3}", fair.utilisation());
    // The flows that want more get it under max-min, not under static.
    assert!(fair.usage[3] > fixed.usage[3] * 1.4);
}

#[test]
fn proportional_fills_the_device_too() {
    let mut sim = Sim::new(FairShareMode::Proportional, &[100.0 * MIB, 200.0 * MIB, 300.0 * MIB], &[900.0 * MIB; 3]);
    for _ in 0..10 {
        sim.step();
    }
    assert!(sim.utilisation() >= 0.95, "{:.3}", sim.utilisation());
    // Leftover in proportion to demand: shares 1:2:3.
    let r = sim.usage[2] / sim.usage[0];
    assert!((r - 3.0).abs() < 0.15, "ratio {r}");
}

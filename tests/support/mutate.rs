//! A small, dependency-free mutation fuzzer for parsers of outside input: seeds from real files,
//! mutated by truncation, bit flips, inserted and deleted runs, extreme integers where lengths
//! and counts live, and (for JSON) values of the wrong type. Each target runs a bounded number
//! of cases (`BACKPACK_FUZZ_CASES` raises it for longer local runs) within a time limit; a panic
//! fails the test with the input saved for reproduction, and so does a case that runs too long.

#![allow(dead_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

/// xorshift64*: deterministic per target, so a failure reproduces.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Integers that break length and count arithmetic.
const EXTREMES: [u64; 8] = [
    0,
    1,
    0x7F,
    0xFFFF,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    0x7FFF_FFFF_FFFF_FFFF,
    u64::MAX,
];

/// One to four byte-level mutations of `seed`, biased to its first `focus` bytes (where headers,
/// lengths and counts are) when `focus` is set.
pub fn mutate_bytes(seed: &[u8], rng: &mut Rng, focus: Option<usize>) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let span = match focus {
            Some(f) if !rng.chance(4) => f.min(out.len()).max(1),
            _ => out.len().max(1),
        };
        let at = rng.below(span);
        match rng.below(7) {
            0 => out.truncate(at),
            1 => {
                if let Some(b) = out.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
            2 => {
                if let Some(b) = out.get_mut(at) {
                    *b = rng.next() as u8;
                }
            }
            3 => {
                let extra: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
                let at = at.min(out.len());
                out.splice(at..at, extra);
            }
            4 => {
                let end = (at + 1 + rng.below(64)).min(out.len());
                if at < end {
                    out.drain(at..end);
                }
            }
            5 => {
                let width = [2usize, 4, 8][rng.below(3)];
                let value = EXTREMES[rng.below(EXTREMES.len())].to_le_bytes();
                for (i, b) in value.iter().take(width).enumerate() {
                    if let Some(slot) = out.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
            _ => {
                let end = (at + 1 + rng.below(32)).min(out.len());
                if at < end {
                    let copy = out[at..end].to_vec();
                    out.splice(at..at, copy);
                }
            }
        }
    }
    out
}

/// Values of every JSON type, including ones that overflow numbers or nest past parser limits.
fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(2)),
        2 => serde_json::json!(-1),
        3 => serde_json::json!(1e308),
        4 => serde_json::json!(u64::MAX),
        5 => serde_json::json!(0.5),
        6 => Value::String(String::new()),
        7 => Value::String("x".repeat(1 + rng.below(5000))),
        8 => Value::Array(Vec::new()),
        9 => Value::Object(serde_json::Map::new()),
        10 => {
            let mut v = Value::Null;
            for _ in 0..rng.below(40) {
                v = Value::Array(vec![v]);
            }
            v
        }
        _ => serde_json::json!(i64::MIN),
    }
}

/// Replaces, removes or retypes one value somewhere in `value`.
pub fn mutate_json(value: &mut Value, rng: &mut Rng) {
    let descend = !rng.chance(3);
    match value {
        Value::Object(map) if !map.is_empty() && descend => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .unwrap_or_default();
            if rng.chance(4) {
                map.remove(&key);
            } else if let Some(child) = map.get_mut(&key) {
                mutate_json(child, rng);
            }
        }
        Value::Array(list) if !list.is_empty() && descend => {
            let i = rng.below(list.len());
            if rng.chance(4) {
                list.remove(i);
            } else {
                mutate_json(&mut list[i], rng);
            }
        }
        _ => *value = hostile_value(rng),
    }
}

/// A mutated case from `seed`: for a JSON seed, a structural mutation half the time.
pub fn mutate(seed: &[u8], rng: &mut Rng, focus: Option<usize>) -> Vec<u8> {
    if rng.chance(2)
        && let Ok(mut json) = serde_json::from_slice::<Value>(seed)
    {
        for _ in 0..1 + rng.below(3) {
            mutate_json(&mut json, rng);
        }
        return serde_json::to_vec(&json).expect("json");
    }
    mutate_bytes(seed, rng, focus)
}

/// The number of cases each target runs: its default, or `BACKPACK_FUZZ_CASES`.
pub fn cases(default: usize) -> usize {
    std::env::var("BACKPACK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub struct Report {
    pub cases: usize,
    pub accepted: usize,
    pub refused: usize,
}

/// Runs `target` on the seeds themselves, then on mutated cases, until `cases` have run or
/// `time` has passed. `target` returns Ok for input it accepted and Err (the message) for input
/// it refused; either is fine. A panic, or one case running past `slow`, fails the test.
pub fn fuzz(
    name: &str,
    seeds: &[Vec<u8>],
    default_cases: usize,
    focus: Option<usize>,
    target: impl Fn(&[u8]) -> Result<(), String>,
) -> Report {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let total = cases(default_cases);
    let limit = if total > default_cases {
        Duration::from_secs(3600)
    } else {
        Duration::from_secs(60)
    };
    let slow = Duration::from_secs(20);
    let started = Instant::now();
    let mut rng = Rng::new(
        name.bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
    );
    let mut report = Report {
        cases: 0,
        accepted: 0,
        refused: 0,
    };
    let mut sample_error = None;
    for case in 0..total + seeds.len() {
        if case >= seeds.len() && started.elapsed() > limit {
            break;
        }
        let input = if case < seeds.len() {
            seeds[case].clone()
        } else {
            mutate(&seeds[rng.below(seeds.len())], &mut rng, focus)
        };
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| target(&input)));
        let took = began.elapsed();
        match outcome {
            Ok(Ok(())) => report.accepted += 1,
            Ok(Err(message)) => {
                assert!(
                    !message.trim().is_empty(),
                    "{name}: an error without a message"
                );
                sample_error.get_or_insert(message);
                report.refused += 1;
            }
            Err(panic) => {
                let path = save(name, &input);
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                panic!(
                    "{name}: case {case} panicked ({what}); input saved to {}",
                    path.display()
                );
            }
        }
        if took > slow {
            let path = save(name, &input);
            panic!(
                "{name}: case {case} took {took:?}; input saved to {}",
                path.display()
            );
        }
        report.cases += 1;
    }
    println!(
        "fuzz {name}: {} cases ({} seeds), {} accepted, {} clean errors, 0 panics, {:.1} s; e.g. {:?}",
        report.cases,
        seeds.len(),
        report.accepted,
        report.refused,
        started.elapsed().as_secs_f64(),
        sample_error.unwrap_or_default()
    );
    report
}

fn save(name: &str, input: &[u8]) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("backpack-fuzz-{name}-{}.bin", std::process::id()));
    let _ = std::fs::write(&path, input);
    path
}

/// A scratch folder for targets that read files, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("backpack-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

//! diffusers' `FlowMatchEulerDiscreteScheduler`, as the flow-matching pipelines (Z-Image)
//! drive it: a list of sigmas from the pipeline, shifted statically (`shift`) or by the
//! image's token count (`use_dynamic_shifting`, with the pipeline's `mu`), optionally
//! stretched to end at `shift_terminal`, then a terminal zero. A step moves the latent along
//! the predicted velocity: `x ← x + (σ_next − σ)·v`.

use serde_json::Value;

use crate::Error;

/// How sigmas are shifted by the image size (`use_dynamic_shifting`).
#[derive(Clone, Debug, PartialEq)]
pub struct DynamicShift {
    pub base_shift: f64,
    pub max_shift: f64,
    pub base_seq_len: f64,
    pub max_seq_len: f64,
    /// `time_shift_type`: "exponential" (else "linear").
    pub exponential: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FlowMatchConfig {
    pub train_timesteps: u32,
    pub shift: f64,
    pub dynamic: Option<DynamicShift>,
    pub shift_terminal: Option<f64>,
}

fn bad(message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("flow-matching scheduler config: {message}"))
}

fn number(v: &Value, key: &str, default: f64) -> Result<f64, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_f64()
            .ok_or_else(|| bad(format!("{key} is not a number: {x}"))),
    }
}

fn switch(v: &Value, key: &str) -> Result<bool, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(x) => Err(bad(format!("{key} is not true or false: {x}"))),
    }
}

impl FlowMatchConfig {
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let class = v.get("_class_name").and_then(Value::as_str).unwrap_or("");
        if class != "FlowMatchEulerDiscreteScheduler" {
            return Err(bad(format!(
                "unsupported scheduler {class:?} (FlowMatchEulerDiscreteScheduler is)"
            )));
        }
        for key in [
            "use_karras_sigmas",
            "use_exponential_sigmas",
            "use_beta_sigmas",
            "invert_sigmas",
            "stochastic_sampling",
        ] {
            if switch(v, key)? {
                return Err(bad(format!("{key} is not supported")));
            }
        }
        let dynamic = if switch(v, "use_dynamic_shifting")? {
            let kind = v
                .get("time_shift_type")
                .and_then(Value::as_str)
                .unwrap_or("exponential");
            if kind != "exponential" && kind != "linear" {
                return Err(bad(format!("time_shift_type {kind:?}")));
            }
            let shift = DynamicShift {
                base_shift: number(v, "base_shift", 0.5)?,
                max_shift: number(v, "max_shift", 1.15)?,
                base_seq_len: number(v, "base_image_seq_len", 256.0)?,
                max_seq_len: number(v, "max_image_seq_len", 4096.0)?,
                exponential: kind == "exponential",
            };
            // mu is a line through (base_seq_len, base_shift) and (max_seq_len, max_shift);
            // exponential shifts take e^mu, so it stays within what f64 holds.
            let bounded = |x: f64| x.is_finite() && x.abs() <= 50.0;
            if shift.max_seq_len <= shift.base_seq_len
                || shift.base_seq_len < 0.0
                || !bounded(shift.base_shift)
                || !bounded(shift.max_shift)
                || shift.max_seq_len > 1e9
            {
                return Err(bad(format!(
                    "dynamic shifting from ({}, {}) to ({}, {}) tokens and shifts",
                    shift.base_seq_len, shift.base_shift, shift.max_seq_len, shift.max_shift
                )));
            }
            Some(shift)
        } else {
            None
        };
        let train = number(v, "num_train_timesteps", 1000.0)?;
        let shift = number(v, "shift", 1.0)?;
        let terminal = number(v, "shift_terminal", 0.0)?;
        let valid = (1.0..=100_000.0).contains(&train)
            && shift.is_finite()
            && shift > 0.0
            && shift <= 1e6
            && (0.0..1.0).contains(&terminal);
        if !valid {
            return Err(bad(format!(
                "num_train_timesteps {train}, shift {shift}, shift_terminal {terminal}"
            )));
        }
        Ok(Self {
            train_timesteps: train as u32,
            shift,
            dynamic,
            shift_terminal: (terminal > 0.0).then_some(terminal),
        })
    }

    /// The pipeline's `mu` for an image of `tokens` patch tokens (`calculate_shift`).
    fn mu(d: &DynamicShift, tokens: u32) -> f64 {
        let m = (d.max_shift - d.base_shift) / (d.max_seq_len - d.base_seq_len);
        let b = d.base_shift - m * d.base_seq_len;
        f64::from(tokens) * m + b
    }

    /// The schedule's sigmas from the pipeline's `base` list, with the terminal zero
    /// appended (`set_timesteps(sigmas=base, mu=…)`); `tokens` is the image's patch count.
    /// Refused where the shift leaves them outside 0..=1 (where diffusers overflows or
    /// divides by zero).
    pub fn sigmas(&self, base: &[f32], tokens: u32) -> Result<Vec<f32>, Error> {
        let mu = self.dynamic.as_ref().map(|d| Self::mu(d, tokens));
        self.shifted(base, mu).map_err(|sigma| {
            bad(format!(
                "the shift for {tokens} image tokens gives sigma {sigma}, outside 0..1"
            ))
        })
    }

    /// As [`Self::sigmas`], with the pipeline's own `mu` (FLUX.2's empirical one) for a
    /// dynamic shift; a static shift ignores it, as `set_timesteps` does.
    pub fn sigmas_at_mu(&self, base: &[f32], mu: f64) -> Result<Vec<f32>, Error> {
        let mu = self.dynamic.as_ref().map(|_| mu);
        self.shifted(base, mu)
            .map_err(|sigma| bad(format!("mu {mu:?} gives sigma {sigma}, outside 0..1")))
    }

    /// `base` shifted (dynamically by `mu` where given, else statically), stretched to the
    /// terminal sigma, with the final zero; or the first sigma outside 0..=1.
    fn shifted(&self, base: &[f32], mu: Option<f64>) -> Result<Vec<f32>, f64> {
        let exponential = self.dynamic.as_ref().is_some_and(|d| d.exponential);
        let mut sigmas: Vec<f64> = base
            .iter()
            .map(|&s| {
                let s = f64::from(s);
                match mu {
                    // e^mu / (e^mu + (1/s − 1)), written so that a large mu cannot overflow.
                    Some(mu) if exponential => 1.0 / (1.0 + (-mu).exp() * (1.0 / s - 1.0)),
                    Some(mu) => mu / (mu + (1.0 / s - 1.0)),
                    None => self.shift * s / (1.0 + (self.shift - 1.0) * s),
                }
            })
            .collect();
        // A schedule that ends at 1 (one step) has nothing to stretch.
        if let (Some(terminal), Some(&last)) = (self.shift_terminal, sigmas.last())
            && last < 1.0
        {
            let scale = (1.0 - last) / (1.0 - terminal);
            for s in &mut sigmas {
                *s = 1.0 - (1.0 - *s) / scale;
            }
        }
        if let Some(&bad_sigma) = sigmas.iter().find(|s| !(0.0..=1.0).contains(*s)) {
            return Err(bad_sigma);
        }
        let mut out: Vec<f32> = sigmas.into_iter().map(|s| s as f32).collect();
        out.push(0.0);
        Ok(out)
    }

    /// The model's time for `sigma`, as the pipelines pass it: `(1000 − σ·N) / 1000` with
    /// N training timesteps, in f32 as torch takes it.
    pub fn model_time(&self, sigma: f32) -> f32 {
        (1000.0 - sigma * self.train_timesteps as f32) / 1000.0
    }
}

/// Z-Image's default sigmas before shifting: `linspace(1, 1/steps, steps)`.
pub fn linear_sigmas(steps: u32) -> Vec<f32> {
    let n = steps.max(1);
    if n == 1 {
        return vec![1.0];
    }
    let last = 1.0 / f64::from(n);
    (0..n)
        .map(|i| (1.0 + (last - 1.0) * f64::from(i) / f64::from(n - 1)) as f32)
        .collect()
}

/// A flow-matching step's coefficients in the denoising kernel's form (see the module
/// above): the model's output `out` is the negated velocity (Z-Image's convention), so the
/// clean estimate is `x + σ·out` and the Euler step is `x ← (σ'/σ)·x + (1 − σ'/σ)·x₀`.
pub struct FlowStep {
    pub sigma: f32,
    pub p: f32,
    pub q: f32,
    pub a: f32,
    pub b: f32,
}

pub fn flow_step(sigma: f32, next: f32, out_is_negated_velocity: bool) -> FlowStep {
    let q = if out_is_negated_velocity {
        sigma
    } else {
        -sigma
    };
    let ratio = if sigma > 0.0 { next / sigma } else { 0.0 };
    FlowStep {
        sigma,
        p: 1.0,
        q,
        a: ratio,
        b: 1.0 - ratio,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn static_shift_as_diffusers() {
        // diffusers 0.42, FlowMatchEulerDiscreteScheduler(shift=3.0).set_timesteps(
        // sigmas=linspace(1, 1/4, 4)).sigmas
        let c = FlowMatchConfig::from_json(&json!({
            "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
            "shift": 3.0, "use_dynamic_shifting": false
        }))
        .expect("config");
        let s = c.sigmas(&linear_sigmas(4), 4096).expect("sigmas");
        let want = [1.0, 0.9, 0.75, 0.5, 0.0];
        for (a, b) in s.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{s:?}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let err = |v: Value| {
            FlowMatchConfig::from_json(&v)
                .expect_err("refused")
                .to_string()
        };
        let base = json!({ "_class_name": "FlowMatchEulerDiscreteScheduler" });
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            c[k] = v;
            c
        };
        assert!(err(with("use_karras_sigmas", json!(true))).contains("use_karras_sigmas"));
        assert!(err(with("shift", json!("3"))).contains("shift"));
        assert!(err(with("shift", json!(-1.0))).contains("shift"));
        assert!(err(json!({ "_class_name": "EulerDiscreteScheduler" })).contains("Euler"));
    }

    #[test]
    fn shifts_that_leave_zero_to_one_are_refused() {
        let config = |extra: Value| {
            let mut c = json!({
                "_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": true,
                "base_shift": 0.5, "max_shift": 50.0
            });
            c.as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            FlowMatchConfig::from_json(&c).expect("config")
        };
        // A huge mu saturates the exponential form at 1 rather than overflowing to NaN.
        let s = config(json!({}))
            .sigmas(&linear_sigmas(4), 1 << 20)
            .expect("sigmas");
        assert!(s.iter().all(|v| (0.0..=1.0).contains(v)), "{s:?}");
        // A negative mu in the linear form gives sigmas outside 0..1: refused.
        let linear =
            config(json!({ "time_shift_type": "linear", "base_shift": -5.0, "max_shift": -4.0 }));
        assert!(linear.sigmas(&linear_sigmas(4), 1024).is_err());
    }

    #[test]
    fn a_step_reaches_the_clean_estimate_at_zero() {
        let s = flow_step(0.5, 0.0, true);
        // x = 1, out = −2 (velocity 2): x₀ = 1 + 0.5·(−2) = 0, and the last step lands there.
        let x0 = s.p * 1.0 + s.q * -2.0;
        assert!((x0 - 0.0).abs() < 1e-6);
        assert!((s.a * 1.0 + s.b * x0 - 0.0).abs() < 1e-6);
    }
}

//! `scheduler/scheduler_config.json` as diffusers reads it. A key the file leaves out takes the
//! default of the scheduler class that runs, not of the class named in the file: that is what
//! diffusers' `Scheduler.from_config(pipe.scheduler.config)` does, and why every field here is
//! optional until [`SchedulerConfig::params`] resolves it for one [`SchedulerKind`].

use std::path::Path;

use serde_json::{Map, Value};

use super::SchedulerKind;
use crate::Error;
use crate::load::{LoadError, read_json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BetaSchedule {
    Linear,
    ScaledLinear,
    SquaredCosCapV2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Prediction {
    Epsilon,
    Velocity,
    Sample,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Spacing {
    Linspace,
    Leading,
    Trailing,
}

/// Where the noise levels of the steps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SigmaSpacing {
    /// σ of the spaced timesteps.
    Timesteps,
    /// A Karras ramp between the end sigmas, timesteps mapped back from it.
    Karras,
    /// Evenly spaced in ln σ, timesteps mapped back from it.
    Exponential,
}

/// A scheduler config as read; `None` means "the running scheduler class's default".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulerConfig {
    class_name: Option<String>,
    num_train_timesteps: Option<u32>,
    beta_start: Option<f64>,
    beta_end: Option<f64>,
    beta_schedule: Option<BetaSchedule>,
    trained_betas: Option<Vec<f32>>,
    prediction_type: Option<Prediction>,
    timestep_spacing: Option<Spacing>,
    steps_offset: Option<u32>,
    rescale_betas_zero_snr: Option<bool>,
    log_linear: Option<bool>,
    use_karras_sigmas: Option<bool>,
    use_exponential_sigmas: Option<bool>,
    use_beta_sigmas: Option<bool>,
    sigma_min: Option<f64>,
    sigma_max: Option<f64>,
    continuous_timesteps: Option<bool>,
    final_sigma_min: Option<bool>,
    heun: Option<bool>,
    lower_order_final: Option<bool>,
    euler_at_final: Option<bool>,
    original_inference_steps: Option<u32>,
    timestep_scaling: Option<f64>,
    clip_sample: Option<bool>,
    thresholding: Option<bool>,
}

/// A config resolved for one scheduler kind, with that class's defaults filled in.
#[derive(Clone, Debug)]
pub(super) struct Params {
    pub num_train_timesteps: u32,
    pub beta_start: f64,
    pub beta_end: f64,
    pub beta_schedule: BetaSchedule,
    pub trained_betas: Option<Vec<f32>>,
    pub prediction: Prediction,
    pub spacing: Spacing,
    pub steps_offset: u32,
    pub rescale_zero_snr: bool,
    /// Euler's `interpolation_type = "log_linear"`: sigmas evenly spaced in ln σ over the whole
    /// training range, one more than the steps, ignoring the timesteps.
    pub log_linear: bool,
    pub sigma_spacing: SigmaSpacing,
    pub sigma_min: Option<f64>,
    pub sigma_max: Option<f64>,
    /// Euler with v-prediction: the UNet sees `0.25·ln σ` instead of a discrete timestep.
    pub continuous_timesteps: bool,
    /// The sigma after the last step: σ(t=0) instead of 0.
    pub final_sigma_min: bool,
    pub heun: bool,
    pub lower_order_final: bool,
    pub euler_at_final: bool,
    pub original_inference_steps: u32,
    pub timestep_scaling: f64,
}

fn invalid(key: &str, message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("scheduler config: {key}: {message}"))
}

/// The value under `key`, with JSON `null` read as absent (diffusers writes `"trained_betas": null`).
fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn float(map: &Map<String, Value>, key: &str) -> Result<Option<f64>, Error> {
    field(map, key)
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| invalid(key, format!("expected a number, got {v}")))
        })
        .transpose()
}

fn uint(map: &Map<String, Value>, key: &str) -> Result<Option<u32>, Error> {
    let Some(x) = float(map, key)? else {
        return Ok(None);
    };
    if x.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&x) {
        return Err(invalid(
            key,
            format!("expected a non-negative integer, got {x}"),
        ));
    }
    Ok(Some(x as u32))
}

fn boolean(map: &Map<String, Value>, key: &str) -> Result<Option<bool>, Error> {
    field(map, key)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| invalid(key, format!("expected true or false, got {v}")))
        })
        .transpose()
}

/// A string field that must be one of `choices`, mapped to its value.
fn choice<T: Copy>(
    map: &Map<String, Value>,
    key: &str,
    choices: &[(&str, T)],
) -> Result<Option<T>, Error> {
    let Some(v) = field(map, key) else {
        return Ok(None);
    };
    let name = v.as_str().unwrap_or_default();
    match choices.iter().find(|(n, _)| *n == name) {
        Some(&(_, value)) => Ok(Some(value)),
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            Err(invalid(
                key,
                format!("{v} is not one of {}", names.join(", ")),
            ))
        }
    }
}

fn trained_betas(map: &Map<String, Value>) -> Result<Option<Vec<f32>>, Error> {
    let Some(v) = field(map, "trained_betas") else {
        return Ok(None);
    };
    let list = v
        .as_array()
        .ok_or_else(|| invalid("trained_betas", "expected a list of numbers"))?;
    list.iter()
        .map(|b| {
            b.as_f64()
                .map(|b| b as f32)
                .ok_or_else(|| invalid("trained_betas", format!("{b} is not a number")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl SchedulerConfig {
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let json = read_json(path)?;
        Self::from_json(&json).map_err(|e| match e {
            Error::Invalid(message) => Error::Load(LoadError::Config {
                path: path.to_owned(),
                message,
            }),
            e => e,
        })
    }

    pub fn from_json(value: &Value) -> Result<Self, Error> {
        let map = value
            .as_object()
            .ok_or_else(|| Error::Invalid("scheduler config: expected a JSON object".into()))?;
        Ok(Self {
            class_name: field(map, "_class_name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            num_train_timesteps: uint(map, "num_train_timesteps")?,
            beta_start: float(map, "beta_start")?,
            beta_end: float(map, "beta_end")?,
            beta_schedule: choice(
                map,
                "beta_schedule",
                &[
                    ("linear", BetaSchedule::Linear),
                    ("scaled_linear", BetaSchedule::ScaledLinear),
                    ("squaredcos_cap_v2", BetaSchedule::SquaredCosCapV2),
                ],
            )?,
            trained_betas: trained_betas(map)?,
            prediction_type: choice(
                map,
                "prediction_type",
                &[
                    ("epsilon", Prediction::Epsilon),
                    ("v_prediction", Prediction::Velocity),
                    ("sample", Prediction::Sample),
                    ("original_sample", Prediction::Sample),
                ],
            )?,
            timestep_spacing: choice(
                map,
                "timestep_spacing",
                &[
                    ("linspace", Spacing::Linspace),
                    ("leading", Spacing::Leading),
                    ("trailing", Spacing::Trailing),
                ],
            )?,
            steps_offset: uint(map, "steps_offset")?,
            rescale_betas_zero_snr: boolean(map, "rescale_betas_zero_snr")?,
            log_linear: choice(
                map,
                "interpolation_type",
                &[("linear", false), ("log_linear", true)],
            )?,
            use_karras_sigmas: boolean(map, "use_karras_sigmas")?,
            use_exponential_sigmas: boolean(map, "use_exponential_sigmas")?,
            use_beta_sigmas: boolean(map, "use_beta_sigmas")?,
            sigma_min: float(map, "sigma_min")?,
            sigma_max: float(map, "sigma_max")?,
            continuous_timesteps: choice(
                map,
                "timestep_type",
                &[("discrete", false), ("continuous", true)],
            )?,
            final_sigma_min: choice(
                map,
                "final_sigmas_type",
                &[("zero", false), ("sigma_min", true)],
            )?,
            // Other solver types are aliases diffusers maps to midpoint.
            heun: field(map, "solver_type").map(|v| v.as_str() == Some("heun")),
            lower_order_final: boolean(map, "lower_order_final")?,
            euler_at_final: boolean(map, "euler_at_final")?,
            original_inference_steps: uint(map, "original_inference_steps")?,
            timestep_scaling: float(map, "timestep_scaling")?,
            clip_sample: boolean(map, "clip_sample")?,
            thresholding: boolean(map, "thresholding")?,
        })
    }

    /// The kind the model ships with; classes without a counterpart here (PNDM, DDIM, ...) run
    /// as Euler, which every Stable Diffusion checkpoint works with.
    pub fn default_kind(&self) -> SchedulerKind {
        match self.class_name.as_deref() {
            Some("EulerAncestralDiscreteScheduler") => SchedulerKind::EulerAncestral,
            Some("DPMSolverMultistepScheduler") => SchedulerKind::DpmPp2mKarras,
            Some("LCMScheduler") => SchedulerKind::Lcm,
            _ => SchedulerKind::Euler,
        }
    }

    /// The `_class_name` the file names, if any.
    pub fn class_name(&self) -> Option<&str> {
        self.class_name.as_deref()
    }

    /// The timestep spacing the model's own scheduler uses: the file's, or the default of
    /// [`Self::default_kind`] ("trailing" marks the few-step Turbo models).
    pub fn timestep_spacing(&self) -> &'static str {
        let default = if self.default_kind() == SchedulerKind::Lcm {
            Spacing::Leading
        } else {
            Spacing::Linspace
        };
        match self.timestep_spacing.unwrap_or(default) {
            Spacing::Linspace => "linspace",
            Spacing::Leading => "leading",
            Spacing::Trailing => "trailing",
        }
    }

    /// Resolves the config for `kind` with that diffusers class's defaults, and refuses the
    /// options this coefficient form cannot express.
    pub(super) fn params(&self, kind: SchedulerKind) -> Result<Params, Error> {
        let lcm = kind == SchedulerKind::Lcm;
        let euler = kind == SchedulerKind::Euler;
        if self.use_beta_sigmas == Some(true) && euler {
            return Err(Error::Invalid(
                "scheduler config: use_beta_sigmas is not supported; pick another scheduler".into(),
            ));
        }
        let nonlinear = match kind {
            SchedulerKind::Lcm => self.thresholding == Some(true) || self.clip_sample == Some(true),
            SchedulerKind::DpmPp2mKarras => self.thresholding == Some(true),
            _ => false,
        };
        if nonlinear {
            return Err(Error::Invalid(format!(
                "scheduler config: thresholding and clip_sample are not supported by {}; pick another scheduler",
                kind.name()
            )));
        }
        let sigma_spacing = match kind {
            SchedulerKind::DpmPp2mKarras => SigmaSpacing::Karras,
            SchedulerKind::Euler if self.use_karras_sigmas == Some(true) => SigmaSpacing::Karras,
            SchedulerKind::Euler if self.use_exponential_sigmas == Some(true) => {
                SigmaSpacing::Exponential
            }
            _ => SigmaSpacing::Timesteps,
        };
        Ok(Params {
            num_train_timesteps: self.num_train_timesteps.unwrap_or(1000),
            beta_start: self
                .beta_start
                .unwrap_or(if lcm { 0.00085 } else { 0.0001 }),
            beta_end: self.beta_end.unwrap_or(if lcm { 0.012 } else { 0.02 }),
            beta_schedule: self.beta_schedule.unwrap_or(if lcm {
                BetaSchedule::ScaledLinear
            } else {
                BetaSchedule::Linear
            }),
            trained_betas: self.trained_betas.clone(),
            prediction: self.prediction_type.unwrap_or(Prediction::Epsilon),
            spacing: self.timestep_spacing.unwrap_or(if lcm {
                Spacing::Leading
            } else {
                Spacing::Linspace
            }),
            steps_offset: self.steps_offset.unwrap_or(0),
            rescale_zero_snr: self.rescale_betas_zero_snr.unwrap_or(false),
            log_linear: euler && self.log_linear == Some(true),
            sigma_spacing,
            // Only EulerDiscreteScheduler has these two.
            sigma_min: self.sigma_min.filter(|_| euler),
            sigma_max: self.sigma_max.filter(|_| euler),
            continuous_timesteps: euler
                && self.continuous_timesteps == Some(true)
                && self.prediction_type == Some(Prediction::Velocity),
            // Euler Ancestral always ends at σ = 0.
            final_sigma_min: self.final_sigma_min.unwrap_or(false)
                && kind != SchedulerKind::EulerAncestral,
            heun: self.heun.unwrap_or(false),
            lower_order_final: self.lower_order_final.unwrap_or(true),
            euler_at_final: self.euler_at_final.unwrap_or(false),
            original_inference_steps: self.original_inference_steps.unwrap_or(50),
            timestep_scaling: self.timestep_scaling.unwrap_or(10.0),
        })
    }
}

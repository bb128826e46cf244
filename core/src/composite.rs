//! A composite uploaded model: several TorchScript modules in one archive, joined by a manifest
//! (`composite.json`) that says what each module takes. One definition for the check (which reads the
//! archive), the API (which checks a job's placement of the modules on a worker's devices) and the worker
//! (which runs a stage's modules and passes their outputs on).
//!
//! The manifest lists the modules in the order they run: each takes named inputs of the data set (its
//! tensors `x.NAME`) or the outputs of modules listed before it, in the order `forward` takes them; the last
//! module's output is the model's (class scores, or values). The seed's model is three encoders, one per
//! kind of input, and a head:
//!
//! ```json
//! {"modules": [
//!   {"name": "encode_numeric", "inputs": ["numeric"]},
//!   {"name": "encode_sequence", "inputs": ["tokens", "tokens_mask"]},
//!   {"name": "encode_set", "inputs": ["set", "set_mask"]},
//!   {"name": "head", "inputs": ["encode_numeric", "encode_sequence", "encode_set"]}
//! ]}
//! ```
//!
//! A job may place the modules on its worker's devices (`placement.stages`): each stage a list of modules,
//! each module in one stage, no module before one whose output it takes. Between two stages travel the
//! outputs computed on one side and taken on the other ([`StagePlan::sends`]), forward; their gradients,
//! backward.

use serde::{Deserialize, Serialize};

/// The archive member that names the modules; each module is the member `NAME.pt`.
pub const MANIFEST: &str = "composite.json";

/// The bytes of a file's start that tell a composite model's archive from a TorchScript file.
pub const ARCHIVE_HEAD_BYTES: usize = 262;

/// Whether a file starting with `head` (its first [`ARCHIVE_HEAD_BYTES`]) is a POSIX tar archive (a
/// composite model: "ustar" at offset 257) rather than a TorchScript file (a zip archive).
pub fn is_archive_head(head: &[u8]) -> bool {
    head.get(257..ARCHIVE_HEAD_BYTES) == Some(b"ustar".as_slice())
}

/// The most modules a composite model holds.
pub const MAX_MODULES: usize = 64;

/// The longest module or input name.
const MAX_NAME: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub modules: Vec<ModuleEntry>,
}

/// One module: its name (its file is `NAME.pt`) and what its `forward` takes, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleEntry {
    pub name: String,
    pub inputs: Vec<String>,
}

/// What one stage of a placement runs and passes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// Its modules, as indices into the manifest, in the order they run.
    pub modules: Vec<usize>,
    /// The module outputs it gets from the previous stage, in this order (the previous stage's `sends`).
    pub receives: Vec<String>,
    /// The module outputs it hands to the next stage: those computed here or received, that a later stage
    /// takes. Empty in the last stage, whose output is the model's.
    pub sends: Vec<String>,
}

/// A module or input name: a letter or `_`, then letters, digits or `_` (a file name and a VarStore path
/// segment alike).
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_NAME
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Manifest {
    /// Reads and checks a manifest: names, each module's inputs, the order. The error says what is wrong
    /// and where.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, String> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| format!("{MANIFEST} is not a composite model's manifest: {e}"))?;
        manifest.check()?;
        Ok(manifest)
    }

    fn check(&self) -> Result<(), String> {
        let count = self.modules.len();
        if !(2..=MAX_MODULES).contains(&count) {
            return Err(format!("{MANIFEST} lists {count} modules: a composite model has 2 to {MAX_MODULES}"));
        }
        for (i, module) in self.modules.iter().enumerate() {
            let name = &module.name;
            if !valid_name(name) {
                return Err(format!(
                    "{MANIFEST}: module {i}'s name {name:?} is not a name (a letter or _, then letters, digits or _; at most {MAX_NAME})"
                ));
            }
            if self.modules[..i].iter().any(|m| &m.name == name) {
                return Err(format!("{MANIFEST}: two modules are named {name}"));
            }
            if module.inputs.is_empty() || module.inputs.len() > MAX_MODULES {
                return Err(format!(
                    "{MANIFEST}: module {name} takes {} inputs: 1 to {MAX_MODULES}",
                    module.inputs.len()
                ));
            }
            for input in &module.inputs {
                if !valid_name(input) {
                    return Err(format!("{MANIFEST}: module {name}'s input {input:?} is not a name"));
                }
                match self.index(input) {
                    None if input == "x" => {
                        return Err(format!(
                            "{MANIFEST}: module {name} takes x, a plain data set's one input; a composite model takes named inputs (x.NAME): give them other names"
                        ))
                    }
                    Some(j) if j == i => return Err(format!("{MANIFEST}: module {name} takes its own output")),
                    Some(j) if j > i => {
                        return Err(format!(
                            "{MANIFEST}: module {name} takes {input}'s output, but {input} is listed after it: list the modules in the order they run"
                        ))
                    }
                    _ => {}
                }
            }
        }
        let output = self.output();
        for module in &self.modules[..count - 1] {
            if !self.modules.iter().any(|m| m.inputs.contains(&module.name)) {
                return Err(format!(
                    "{MANIFEST}: no module takes {}'s output (the last module, {output}, is the model's output; every other one must feed another)",
                    module.name
                ));
            }
        }
        Ok(())
    }

    /// The module named `name`, by its place in the manifest.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.modules.iter().position(|m| m.name == name)
    }

    /// The module whose output is the model's: the last.
    pub fn output(&self) -> &str {
        self.modules.last().map_or("", |m| m.name.as_str())
    }

    /// The module names, in order.
    pub fn names(&self) -> Vec<String> {
        self.modules.iter().map(|m| m.name.clone()).collect()
    }

    /// The data set's inputs the model takes (every input that is not a module's output), in the order
    /// they are first taken: the worker loads these `x.NAME`, in this order.
    pub fn data_inputs(&self) -> Vec<String> {
        let mut inputs: Vec<String> = Vec::new();
        for input in self.modules.iter().flat_map(|m| &m.inputs) {
            if self.index(input).is_none() && !inputs.contains(input) {
                inputs.push(input.clone());
            }
        }
        inputs
    }

    /// The whole model as one stage.
    pub fn whole(&self) -> StagePlan {
        StagePlan { modules: (0..self.modules.len()).collect(), receives: Vec::new(), sends: Vec::new() }
    }

    /// What each stage of `stages` (module names per stage, in a job's `placement.stages`) runs, gets and
    /// passes on. The error is `(stage, reason)`: the stage at fault (None: the placement as a whole).
    pub fn plan(&self, stages: &[Vec<String>]) -> Result<Vec<StagePlan>, (Option<usize>, String)> {
        let mut stage_of: Vec<Option<usize>> = vec![None; self.modules.len()];
        for (s, names) in stages.iter().enumerate() {
            if names.is_empty() {
                return Err((Some(s), "a stage without modules: a device would have no work".to_string()));
            }
            for name in names {
                let Some(i) = self.index(name) else {
                    return Err((
                        Some(s),
                        format!("the model has no module {name} (it has {})", self.names().join(", ")),
                    ));
                };
                if let Some(other) = stage_of[i] {
                    return Err((Some(s), format!("module {name} is placed twice (stages {other} and {s})")));
                }
                stage_of[i] = Some(s);
            }
        }
        let last = stages.len().saturating_sub(1);
        let mut placed = Vec::with_capacity(self.modules.len());
        for (i, module) in self.modules.iter().enumerate() {
            let Some(s) = stage_of[i] else {
                return Err((None, format!("module {} is in no stage: place every module", module.name)));
            };
            for input in &module.inputs {
                if let Some(from) = self.index(input).and_then(|j| stage_of[j]) {
                    if from > s {
                        return Err((
                            Some(s),
                            format!("module {} takes {input}'s output, which stage {from} computes after it: a module's inputs come from its own or an earlier stage", module.name),
                        ));
                    }
                }
            }
            placed.push(s);
        }
        // (the order above already puts the output last: every other module feeds one in its own or a
        // later stage; kept so that a plan never sends the output on)
        if placed.last() != Some(&last) {
            return Err((Some(last), format!("the last stage must hold {}, the model's output", self.output())));
        }
        let mut plans: Vec<StagePlan> = Vec::with_capacity(stages.len());
        for s in 0..stages.len() {
            let receives = plans.last().map(|p| p.sends.clone()).unwrap_or_default();
            let modules: Vec<usize> = (0..self.modules.len()).filter(|&i| placed[i] == s).collect();
            // an output crosses to stage s + 1 when it is computed up to s and taken after s
            let sends = (0..self.modules.len())
                .filter(|&i| placed[i] <= s && s < last)
                .filter(|&i| {
                    self.modules
                        .iter()
                        .enumerate()
                        .any(|(j, m)| placed[j] > s && m.inputs.contains(&self.modules[i].name))
                })
                .map(|i| self.modules[i].name.clone())
                .collect();
            plans.push(StagePlan { modules, receives, sends });
        }
        Ok(plans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> Manifest {
        Manifest::parse(
            br#"{"modules": [
              {"name": "encode_numeric", "inputs": ["numeric"]},
              {"name": "encode_sequence", "inputs": ["tokens", "tokens_mask"]},
              {"name": "encode_set", "inputs": ["set", "set_mask"]},
              {"name": "head", "inputs": ["encode_numeric", "encode_sequence", "encode_set"]}
            ]}"#,
        )
        .unwrap()
    }

    fn stages(names: &[&[&str]]) -> Vec<Vec<String>> {
        names.iter().map(|s| s.iter().map(|n| n.to_string()).collect()).collect()
    }

    #[test]
    fn the_data_inputs_are_what_no_module_makes_in_the_order_first_taken() {
        let manifest = seed();
        assert_eq!(manifest.data_inputs(), ["numeric", "tokens", "tokens_mask", "set", "set_mask"]);
        assert_eq!(manifest.output(), "head");
        assert_eq!(manifest.whole().modules, [0, 1, 2, 3]);
    }

    #[test]
    fn each_stage_passes_on_what_a_later_stage_takes() {
        let manifest = seed();
        let plans = manifest.plan(&stages(&[&["encode_numeric", "encode_sequence"], &["encode_set", "head"]])).unwrap();
        assert_eq!(plans[0].modules, [0, 1]);
        assert_eq!(
            (plans[0].receives.len(), plans[0].sends.clone()),
            (0, vec!["encode_numeric".into(), "encode_sequence".into()])
        );
        assert_eq!(plans[1].receives, plans[0].sends);
        assert!(plans[1].sends.is_empty());
        // three stages: the middle one passes the first's output along with its own, in the manifest's order
        let plans =
            manifest.plan(&stages(&[&["encode_sequence"], &["encode_numeric"], &["encode_set", "head"]])).unwrap();
        assert_eq!(plans[1].sends, ["encode_numeric", "encode_sequence"]);
        assert_eq!(plans[1].receives, ["encode_sequence"]);
    }

    #[test]
    fn a_placement_that_cannot_run_is_refused_naming_the_stage() {
        let manifest = seed();
        let refused = |names: &[&[&str]]| manifest.plan(&stages(names)).unwrap_err();
        let (at, why) = refused(&[&["head", "encode_numeric"], &["encode_sequence", "encode_set"]]);
        assert_eq!(at, Some(0), "{why}");
        assert!(why.contains("head takes encode_sequence's output, which stage 1 computes after it"), "{why}");
        let (at, why) = refused(&[&["encode_numeric"], &["encode_nothing", "head"]]);
        assert!(at == Some(1) && why.contains("no module encode_nothing"), "{why}");
        let (at, why) = refused(&[&["encode_numeric", "encode_sequence"], &["encode_set", "head", "encode_numeric"]]);
        assert!(at == Some(1) && why.contains("placed twice"), "{why}");
        let (at, why) = refused(&[&["encode_numeric", "encode_sequence"], &["head"]]);
        assert!(at.is_none() && why.contains("encode_set is in no stage"), "{why}");
        let (at, why) = refused(&[&[], &["encode_numeric", "encode_sequence", "encode_set", "head"]]);
        assert!(at == Some(0) && why.contains("without modules"), "{why}");
    }

    #[test]
    fn a_manifest_out_of_order_or_with_a_dead_end_is_refused() {
        for (text, expected) in [
            (
                r#"{"modules": [{"name": "head", "inputs": ["enc"]}, {"name": "enc", "inputs": ["v"]}]}"#,
                "listed after it",
            ),
            (
                r#"{"modules": [{"name": "a", "inputs": ["v"]}, {"name": "b", "inputs": ["v"]}]}"#,
                "no module takes a's output",
            ),
            (r#"{"modules": [{"name": "a", "inputs": ["v"]}]}"#, "2 to 64"),
            (r#"{"modules": [{"name": "a/b", "inputs": ["v"]}, {"name": "b", "inputs": ["a/b"]}]}"#, "not a name"),
            (r#"{"modules": [{"name": "a", "inputs": []}, {"name": "b", "inputs": ["a"]}]}"#, "takes 0 inputs"),
            (r#"{"modules": [{"name": "a", "inputs": ["y"]}, {"name": "a", "inputs": ["a"]}]}"#, "two modules"),
            (
                r#"{"modules": [{"name": "a", "inputs": ["x"]}, {"name": "b", "inputs": ["a"]}]}"#,
                "a plain data set's one input",
            ),
            (r#"{"modules": [], "extra": 1}"#, "unknown field"),
        ] {
            let why = Manifest::parse(text.as_bytes()).unwrap_err();
            assert!(why.contains(expected), "{text}: {why}");
        }
    }
}

//! Reading a spec as a user wrote it with every problem reported at once: the structural ones (an unknown
//! field, with the known name it is closest to; a wrong type; an unknown value) together with the range and
//! consistency checks of [`crate::validate`].
//!
//! serde stops at its first error, so the document is read again after each one with the field in error
//! taken out (its default then applies, and the rest can be read). A range or consistency problem found
//! where the default stood in (in the object that held a value in error, or at an unknown field) may be a
//! consequence of that error rather than news, and is left out. A field that has no default (`model`,
//! `dataset`) cannot be taken out: its error ends the reading with the structural problems found so far.

use serde_json::Value;
use serde_path_to_error::Segment;

use crate::error::FieldError;
use crate::spec::JobSpec;

/// At most this many structural problems are collected (each costs one more reading of the document).
const MAX_STRUCTURAL: usize = 64;

/// A spec read with the fields in error at their defaults, and those errors.
#[derive(Debug, Clone)]
pub struct SpecReading {
    /// The spec with every field in error left at its default.
    pub spec: JobSpec,
    /// The structural problems, in the order serde met them.
    pub errors: Vec<FieldError>,
    /// Where a range or consistency problem is a consequence of a field taken out: the field itself for
    /// an unknown one (nothing else read it), the object holding it for a value in error (its siblings
    /// were checked against the default that stood in).
    consequences: Vec<String>,
}

impl SpecReading {
    /// The structural problems and `semantic` ones together (those at or below a field in error left out),
    /// or the spec when there are none.
    pub fn finish(self, semantic: Vec<FieldError>) -> Result<JobSpec, Vec<FieldError>> {
        let mut errors = self.errors;
        let scopes = self.consequences;
        let news = semantic.into_iter().filter(|e| !scopes.iter().any(|scope| is_at_or_below(&e.path, scope)));
        errors.extend(news);
        if errors.is_empty() {
            Ok(self.spec)
        } else {
            Err(errors)
        }
    }

    /// Whether it read without a structural problem.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Reads `value` as a spec: Ok with the structural problems it had (possibly none), or Err with them when a
/// field without a default was in error or missing.
pub fn read_spec(value: &Value) -> Result<SpecReading, Vec<FieldError>> {
    let mut value = value.clone();
    let mut errors = Vec::new();
    let mut taken_out: Vec<String> = Vec::new();
    let mut consequences = Vec::new();
    loop {
        let err = match serde_path_to_error::deserialize::<_, JobSpec>(&value) {
            Ok(spec) => return Ok(SpecReading { spec, errors, consequences }),
            Err(err) => err,
        };
        let mut segments: Vec<Segment> = err.path().iter().cloned().collect();
        let message = err.inner().to_string();
        // where serde names an unknown field's object and not the field, the field is the message's first word
        if let Some(field) = quoted(&message).first().filter(|_| message.starts_with("unknown field")) {
            let named = matches!(segments.last(), Some(Segment::Map { key }) if key == field);
            if !named {
                segments.push(Segment::Map { key: field.to_string() });
            }
        }
        let path = path_text(&segments);
        let reason = explain(&message);
        // a required field that was taken out comes back as "missing": it was said already
        let already_said = reason.starts_with("missing field")
            && taken_out.iter().any(|taken| missing_field(&reason).is_some_and(|f| *taken == join(&path, f)));
        if !already_said {
            errors.push(FieldError::new(path.clone(), reason));
        }
        let Some(removed) = take_out(&mut value, &segments) else { return Err(errors) };
        if already_said || errors.len() >= MAX_STRUCTURAL {
            return Err(errors);
        }
        let holder = removed.rsplit_once(['.', '[']).map(|(parent, _)| parent.to_string());
        let scope = match holder.filter(|_| !message.starts_with("unknown field")) {
            Some(parent) => parent,
            None => removed.clone(),
        };
        consequences.push(scope);
        taken_out.push(removed);
    }
}

/// `a.b[2].c`, as serde_path_to_error writes paths (and as every other error of the API names fields).
fn path_text(segments: &[Segment]) -> String {
    let mut text = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => text.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(key);
            }
            Segment::Enum { variant } => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(variant);
            }
            Segment::Unknown => text.push_str(".?"),
        }
    }
    text
}

fn join(parent: &str, field: &str) -> String {
    if parent.is_empty() {
        field.to_string()
    } else {
        format!("{parent}.{field}")
    }
}

/// Takes the field at `segments` out of `value` (an element of a list takes the whole list out); returns
/// the path taken out, or None when nothing can be (the document itself, or a path through something other
/// than objects and lists).
fn take_out(value: &mut Value, segments: &[Segment]) -> Option<String> {
    // the last object key on the path: what is removed
    let last_key = segments.iter().rposition(|s| matches!(s, Segment::Map { .. }))?;
    let mut at = value;
    for segment in &segments[..last_key] {
        at = match segment {
            Segment::Map { key } => at.as_object_mut()?.get_mut(key)?,
            Segment::Seq { index } => at.as_array_mut()?.get_mut(*index)?,
            _ => return None,
        };
    }
    let Segment::Map { key } = &segments[last_key] else { return None };
    at.as_object_mut()?.remove(key)?;
    Some(path_text(&segments[..=last_key]))
}

fn is_at_or_below(path: &str, taken_out: &str) -> bool {
    path == taken_out || path.strip_prefix(taken_out).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// The field a "missing field `x`" message names.
fn missing_field(reason: &str) -> Option<&str> {
    quoted(reason).into_iter().next()
}

/// serde's message, with the known name closest to an unknown one.
fn explain(message: &str) -> String {
    let is_unknown = message.starts_with("unknown field") || message.starts_with("unknown variant");
    let names = quoted(message);
    let suggestion = match names.split_first() {
        Some((given, known)) if is_unknown => closest(given, known),
        _ => None,
    };
    match suggestion {
        // the list of every known name is noise next to a likely one
        Some(name) if message.starts_with("unknown field") => {
            format!("unknown field `{}`: did you mean `{name}`?", names[0])
        }
        Some(name) => format!("{message}: did you mean `{name}`?"),
        None => message.to_string(),
    }
}

/// The `backquoted` words of a message, in order.
fn quoted(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

/// The known name nearest `given` when it is near enough to be a slip: at most a third of its letters
/// changed (and at least one may be).
fn closest<'a>(given: &str, known: &[&'a str]) -> Option<&'a str> {
    let allowed = (given.chars().count() / 3).max(1);
    known
        .iter()
        .map(|name| (edit_distance(&given.to_lowercase(), &name.to_lowercase()), *name))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

impl JobSpec {
    /// Reads and validates a spec held as JSON: every structural and semantic problem at once.
    pub fn from_value(value: &Value) -> Result<JobSpec, Vec<FieldError>> {
        let reading = read_spec(value)?;
        let semantic = reading.spec.validate().err().unwrap_or_default();
        reading.finish(semantic)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn errors(value: Value) -> Vec<(String, String)> {
        JobSpec::from_value(&value).unwrap_err().into_iter().map(|e| (e.path, e.reason)).collect()
    }

    #[test]
    fn every_problem_of_the_trial_spec_is_reported_at_once() {
        // the first-user trial's spec: an unknown model, a misspelt field, no workers, a warmup past the end
        let found = errors(json!({
            "model": {"name": "lenet6"},
            "dataset": "synthetic",
            "optimiser": {"momentum": 0.9},
            "workers": 0,
            "epochs": 2,
            "lr": {"warmup": {"kind": "gradual", "epochs": 5}}
        }));
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert!(paths.contains(&"model.name"), "{found:?}");
        assert!(paths.contains(&"optimiser"), "{found:?}");
        assert!(paths.contains(&"workers"), "{found:?}");
        assert!(paths.iter().any(|p| p.starts_with("lr.warmup")), "{found:?}");
        let reason = |path: &str| found.iter().find(|(p, _)| p == path).unwrap().1.clone();
        assert_eq!(reason("optimiser"), "unknown field `optimiser`: did you mean `optimizer`?");
        assert!(reason("model.name").ends_with("did you mean `lenet5`?"), "{}", reason("model.name"));
        // the model's name was taken out: "missing: name a built-in model" would be a consequence, not news
        assert_eq!(paths.iter().filter(|p| **p == "model.name").count(), 1, "{found:?}");
    }

    #[test]
    fn wrong_types_in_several_places_are_all_named() {
        let found = errors(json!({
            "model": {"name": "mlp", "hidden": "wide"},
            "dataset": "synthetic",
            "epochs": "ten",
            "seed": -1,
            "priority": 1
        }));
        let mut paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        paths.sort();
        assert_eq!(paths, ["epochs", "model.hidden", "seed"], "{found:?}");
    }

    #[test]
    fn a_required_field_in_error_ends_the_reading_with_what_was_found() {
        let found = errors(json!({"model": {"name": "mlp"}, "dataset": "cifar-11", "optimizr": {}}));
        let mut paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        paths.sort();
        assert_eq!(paths, ["dataset", "optimizr"], "{found:?}");
        let found = errors(json!({"model": {"name": "mlp"}}));
        assert_eq!(found, [(String::new(), "missing field `dataset`".to_string())]);
    }

    #[test]
    fn a_good_spec_reads_as_before_and_far_names_get_no_suggestion() {
        let spec = JobSpec::from_value(&json!({"model": {"name": "mlp"}, "dataset": "synthetic"})).unwrap();
        assert_eq!(spec.workers, 1);
        let found = errors(json!({"model": {"name": "mlp"}, "dataset": "synthetic", "colour": 1}));
        assert!(found[0].1.starts_with("unknown field `colour`, expected one of"), "{found:?}");
        assert_eq!(edit_distance("optimiser", "optimizer"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}

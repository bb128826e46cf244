//! Ids as users type them: a whole UUID, or the start of one that names a single job or study of the team
//! (`jobs show 76acc08f`, as git and docker take prefixes). A prefix is looked up in the team's list, so
//! it costs a page read per few hundred jobs; a whole UUID costs nothing.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use ringtrain_client::ApiClient;
use uuid::Uuid;

/// An id argument: a UUID, or the start of one (at least one hex digit; dashes where a UUID has them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdArg(String);

impl FromStr for IdArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim().to_ascii_lowercase();
        let well_formed = !text.is_empty()
            && text.len() <= 36
            && text.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
            && Uuid::nil().to_string().chars().zip(text.chars()).all(|(shape, c)| (shape == '-') == (c == '-'));
        if well_formed {
            Ok(IdArg(text))
        } else {
            Err(format!("{text:?} is not an id or the start of one (hex digits, as in 76acc08f)"))
        }
    }
}

impl From<Uuid> for IdArg {
    fn from(id: Uuid) -> Self {
        IdArg(id.to_string())
    }
}

impl fmt::Display for IdArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an id names, and where the team's list of them is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Job,
    Study,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Job => "job",
            Kind::Study => "study",
        }
    }

    /// The most rows a page of its list route serves.
    fn page_size(self) -> u32 {
        match self {
            Kind::Job => 500,
            Kind::Study => 100,
        }
    }
}

/// The UUID `id` names: itself when whole, else the one row of the team's list that starts with it.
pub async fn resolve(api: &ApiClient, id: &IdArg, kind: Kind) -> Result<Uuid> {
    if let Ok(whole) = Uuid::parse_str(&id.0) {
        return Ok(whole);
    }
    let mut found: Vec<(String, String)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let after = cursor.as_ref().map_or_else(String::new, |c| format!("&cursor={c}"));
        let query = format!("limit={}{after}", kind.page_size());
        // (id, name) of each row of the page, and the next page's cursor
        let (rows, next): (Vec<(String, Option<String>)>, _) = match kind {
            Kind::Job => {
                let page = api.jobs(&query).await?;
                (page.jobs.into_iter().map(|j| (j.id.to_string(), j.name)).collect(), page.next_cursor)
            }
            Kind::Study => {
                let page = api.studies(&query).await?;
                (page.studies.into_iter().map(|s| (s.id.to_string(), s.name)).collect(), page.next_cursor)
            }
        };
        for (uuid, name) in rows {
            if uuid.starts_with(&id.0) {
                found.push((uuid, name.unwrap_or_default()));
            }
        }
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    choose(id, kind, found)
}

fn choose(id: &IdArg, kind: Kind, found: Vec<(String, String)>) -> Result<Uuid> {
    match found.as_slice() {
        [] => bail!("no {} of your team has an id starting with {id}", kind.noun()),
        [(one, _)] => Ok(Uuid::parse_str(one)?),
        many => {
            let listed: Vec<String> = many.iter().take(5).map(|(uuid, name)| format!("{uuid} {name}")).collect();
            bail!(
                "{id} starts the ids of {} {}s; give more of it:\n  {}",
                many.len(),
                kind.noun(),
                listed.join("\n  ").trim_end()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_hex_with_dashes_where_a_uuid_has_them() {
        for good in ["76acc08f", "76ACC08F-1", "0", "76acc08f-1c2d-4e5f-8a9b-0c1d2e3f4a5b"] {
            assert!(good.parse::<IdArg>().is_ok(), "{good}");
        }
        for bad in ["", "76acc08g", "76-acc", "x", "76acc08f-1c2d-4e5f-8a9b-0c1d2e3f4a5b0"] {
            assert!(bad.parse::<IdArg>().is_err(), "{bad}");
        }
    }

    #[test]
    fn one_match_is_the_id_and_none_or_several_say_so() {
        let id: IdArg = "ab".parse().unwrap();
        let a = ("ab000000-0000-4000-8000-000000000000".to_string(), "first".to_string());
        let b = ("ab100000-0000-4000-8000-000000000000".to_string(), "second".to_string());
        assert_eq!(choose(&id, Kind::Job, vec![a.clone()]).unwrap().to_string(), a.0);
        let none = choose(&id, Kind::Study, vec![]).unwrap_err().to_string();
        assert_eq!(none, "no study of your team has an id starting with ab");
        let several = choose(&id, Kind::Job, vec![a, b]).unwrap_err().to_string();
        assert!(several.starts_with("ab starts the ids of 2 jobs; give more of it:"), "{several}");
        assert!(several.contains("ab100000-0000-4000-8000-000000000000 second"), "{several}");
    }
}

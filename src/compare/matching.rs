//! Pairs the cases of two runs by `case_id` (the full key: variant, device, dtype and every
//! axis) and lists the unmatched ones both ways. O(rows) time with a hash map.

use std::collections::HashMap;

use crate::results::record::Record;

/// The matched pairs in baseline order, and the case ids found on one side only.
pub struct Matched<'a> {
    pub pairs: Vec<(&'a Record, &'a Record)>,
    /// In the baseline, not in the current run.
    pub only_in_baseline: Vec<String>,
    /// In the current run, not in the baseline.
    pub only_in_current: Vec<String>,
}

pub fn match_cases<'a>(baseline: &'a [Record], current: &'a [Record]) -> Matched<'a> {
    let by_id: HashMap<&str, &Record> = current.iter().map(|r| (r.case_id.as_str(), r)).collect();
    let mut pairs = Vec::new();
    let mut only_in_baseline = Vec::new();
    for b in baseline {
        match by_id.get(b.case_id.as_str()) {
            Some(c) => pairs.push((b, *c)),
            None => only_in_baseline.push(b.case_id.clone()),
        }
    }
    let in_baseline: std::collections::HashSet<&str> =
        baseline.iter().map(|r| r.case_id.as_str()).collect();
    let only_in_current = current
        .iter()
        .filter(|c| !in_baseline.contains(c.case_id.as_str()))
        .map(|c| c.case_id.clone())
        .collect();
    Matched {
        pairs,
        only_in_baseline,
        only_in_current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::record::Status;

    fn rec(id: &str) -> Record {
        let case = crate::config::Config::from_str(
            "[run]\nname = \"t\"\n[axes]\nvariant = \"naive\"\nseq_len = 16\n",
            std::path::Path::new("t.toml"),
            &[],
        )
        .unwrap()
        .expand()
        .remove(0);
        let mut r = Record::for_case("t", &case, Status::Ok, "");
        r.case_id = id.to_string();
        r
    }

    #[test]
    fn unmatched_cases_are_listed_both_ways() {
        let base = [rec("a"), rec("b"), rec("c")];
        let cur = [rec("c"), rec("d"), rec("a")];
        let m = match_cases(&base, &cur);
        let ids: Vec<(&str, &str)> = m
            .pairs
            .iter()
            .map(|(b, c)| (b.case_id.as_str(), c.case_id.as_str()))
            .collect();
        assert_eq!(ids, [("a", "a"), ("c", "c")]);
        assert_eq!(m.only_in_baseline, ["b"]);
        assert_eq!(m.only_in_current, ["d"]);
    }
}

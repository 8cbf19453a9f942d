//! "Did you mean …?" for every name a user types: option keys, stage ids,
//! field names, condition functions. One rule everywhere, so a typo is
//! caught, or not, the same way whichever part of a pipeline it is in.

/// The candidate closest to `word` when it is a likely typo: at most a
/// third of the candidate's length away (at least one edit), counting a
/// swap of two neighbouring letters as one edit. The nearest wins; among
/// equals, the first.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), *c))
        .filter(|(d, c)| *d <= (c.chars().count() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn a_third_of_the_name_at_least_one_edit_and_the_nearest_wins() {
        let names = ["exists", "len"];
        assert_eq!(closest("exsts", &names), Some("exists"));
        assert_eq!(closest("xsts", &names), Some("exists"));
        assert_eq!(closest("xst", &names), None);
        assert_eq!(closest("lex", &names), Some("len"));
        assert_eq!(closest("lxx", &names), None);
        assert_eq!(closest("foo", &names), None);
        // A swap is one typo.
        assert_eq!(closest("lne", &names), Some("len"));
        assert_eq!(closest("stgaes", &["stages", "settings"]), Some("stages"));
        assert_eq!(closest("abcdef", &["abcdxx", "abcdeg"]), Some("abcdeg"));
        // Up to a third of a long name may differ; a short one, one letter
        // (two letters of "ab" would make any two letters a typo of it).
        assert_eq!(closest("abcdefxyz", &["abcdefghi"]), Some("abcdefghi"));
        assert_eq!(closest("abcdewxyz", &["abcdefghi"]), None);
        assert_eq!(closest("xy", &["ab"]), None);
        assert_eq!(closest("pth", &["path", "paths"]), Some("path"));
        assert_eq!(closest("anything", &[]), None);
    }
}

//! AG News: CSV rows of class, title and description, turned into token ids with a
//! word vocabulary built from the training split.

use super::idx::DataError;
use super::{Augment, Dataset, Split};
use crate::model::{PAD_TOKEN, UNK_TOKEN};
use anyhow::Result;
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

/// Lower-cased alphanumeric words.
pub(crate) fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
}

/// Reads an AG News CSV (class 1..4, title, description; no header).
fn read_agnews(path: &Path) -> Result<Vec<(i64, String)>> {
    let hint = "AG News comes as train.csv and test.csv with rows \"class\",\"title\",\"description\"";
    if !path.is_file() {
        return Err(DataError::Missing {
            path: path.into(),
            hint: hint.into(),
        }
        .into());
    }
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(false).from_path(path)?;
    let mut rows = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.map_err(|e| DataError::Invalid {
            path: path.into(),
            what: format!("row {}: {e}", i + 1),
        })?;
        // Kaggle's copy starts with a header row (Class Index,Title,Description).
        if i == 0
            && rec
                .get(0)
                .is_some_and(|c| c.trim().parse::<i64>().is_err() && c.to_lowercase().contains("class"))
        {
            continue;
        }
        let class: i64 = rec
            .get(0)
            .and_then(|c| c.trim().parse().ok())
            .filter(|c| (1..=4).contains(c))
            .ok_or_else(|| DataError::Invalid {
                path: path.into(),
                what: format!("row {}: class {:?} is not 1..4. {hint}", i + 1, rec.get(0).unwrap_or("")),
            })?;
        if rec.len() < 3 {
            return Err(DataError::Invalid {
                path: path.into(),
                what: format!("row {}: expected class,title,description", i + 1),
            }
            .into());
        }
        rows.push((class - 1, format!("{} {}", &rec[1], &rec[2])));
    }
    if rows.is_empty() {
        return Err(DataError::Invalid {
            path: path.into(),
            what: "holds no rows".into(),
        }
        .into());
    }
    Ok(rows)
}

/// Word-level vocabulary of the `size - 2` most frequent training words (ties by
/// word), after padding (0) and unknown (1).
pub(crate) fn build_vocab<'a>(texts: impl Iterator<Item = &'a str>, size: usize) -> HashMap<String, i64> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    for t in texts {
        for w in words(t) {
            *counts.entry(w).or_default() += 1;
        }
    }
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked
        .into_iter()
        .take(size.saturating_sub(2))
        .enumerate()
        .map(|(i, (w, _))| (w, i as i64 + 2))
        .collect()
}

/// Token ids of `text`, truncated or padded to `seq_len`.
pub(crate) fn encode(text: &str, vocab: &HashMap<String, i64>, seq_len: usize) -> Vec<i64> {
    let mut ids: Vec<i64> = words(text).take(seq_len).map(|w| *vocab.get(&w).unwrap_or(&UNK_TOKEN)).collect();
    ids.resize(seq_len, PAD_TOKEN);
    ids
}

pub(crate) fn load_agnews(dir: &Path, seq_len: usize, vocab_size: usize) -> Result<Dataset> {
    let train_rows = read_agnews(&dir.join("train.csv"))?;
    let test_rows = read_agnews(&dir.join("test.csv"))?;
    let vocab = build_vocab(train_rows.iter().map(|(_, t)| t.as_str()), vocab_size);
    let split = |rows: &[(i64, String)]| -> Split {
        let ids: Vec<i64> = rows.iter().flat_map(|(_, t)| encode(t, &vocab, seq_len)).collect();
        let labels: Vec<i64> = rows.iter().map(|(c, _)| *c).collect();
        Split::memory(
            Tensor::from_slice(&ids).view([rows.len() as i64, seq_len as i64]),
            Tensor::from_slice(&labels),
            Augment::None,
        )
    };
    Ok(Dataset {
        stream: None,
        name: "agnews".into(),
        source: dir.display().to_string(),
        train: split(&train_rows),
        test: split(&test_rows),
        classes: 4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agnews_builds_a_vocabulary_and_encodes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("train.csv"),
            "\"3\",\"Wall St. Bears\",\"Short-sellers, Wall Street's dwindling band\"\n\"1\",\"Bears win\",\"The bears, the bears!\"\n",
        )
        .unwrap();
        // Kaggle's copy has a header row, skipped.
        std::fs::write(
            d.path().join("test.csv"),
            "Class Index,Title,Description\n\"4\",\"Unseen words\",\"bears\"\n",
        )
        .unwrap();
        let ds = load_agnews(d.path(), 6, 5).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (2, 1, 4));
        assert_eq!(Vec::<i64>::try_from(&ds.train.labels).unwrap(), vec![2, 0]);
        // Counts: bears 4, the 2, wall 2, ... vocab of 5 keeps pad, unk and the top 3:
        // bears=2, the=3, wall=4 (ties broken alphabetically: "the" before "wall").
        let row = |i: i64| Vec::<i64>::try_from(ds.train.inputs.get(i)).unwrap();
        assert_eq!(row(1), vec![2, 1, 3, 2, 3, 2]);
        assert_eq!(row(0), vec![4, 1, 2, 1, 1, 4], "truncated to 6 tokens");
        assert_eq!(
            Vec::<i64>::try_from(ds.test.inputs.get(0)).unwrap(),
            vec![1, 1, 2, 0, 0, 0],
            "padded"
        );
        std::fs::write(d.path().join("test.csv"), "\"9\",\"x\",\"y\"\n").unwrap();
        let e = load_agnews(d.path(), 6, 5).err().unwrap().to_string();
        assert!(e.contains("test.csv") && e.contains("class \"9\" is not 1..4"), "{e}");
    }
}

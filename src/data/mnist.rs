//! MNIST-format data sets (MNIST, Fashion-MNIST): IDX files read whole into one
//! tensor per split, normalised with the data set's pixel mean and deviation.

use super::idx::{read_idx, DataError};
use super::{dataset_name, Augment, Dataset, DatasetKind, Split};
use anyhow::Result;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// Where Debian's `dataset-fashion-mnist` installs its files.
pub(crate) const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// `dir/stem` or `dir/stem.gz`, whichever exists.
pub(crate) fn idx_file(dir: &Path, stem: &str, hint: &str) -> Result<PathBuf, DataError> {
    for candidate in [dir.join(stem), dir.join(format!("{stem}.gz"))] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(DataError::Missing {
        path: dir.join(format!("{stem}[.gz]")),
        hint: hint.into(),
    })
}

/// Reads one MNIST-format split and normalises pixels with `mean`/`std`.
pub(crate) fn load_idx_split(dir: &Path, prefix: &str, mean: f64, std: f64, hint: &str) -> Result<Split> {
    let img_path = idx_file(dir, &format!("{prefix}-images-idx3-ubyte"), hint)?;
    let lbl_path = idx_file(dir, &format!("{prefix}-labels-idx1-ubyte"), hint)?;
    let (dims, pixels) = read_idx(&img_path, 0x803)?;
    let (ldims, labels) = read_idx(&lbl_path, 0x801)?;
    if dims.len() != 3 || ldims.first() != dims.first() {
        return Err(DataError::Invalid {
            path: img_path,
            what: format!("has shape {dims:?} but {} holds {:?} labels", lbl_path.display(), ldims.first()),
        }
        .into());
    }
    if dims[1..] != [28, 28] {
        return Err(DataError::Invalid {
            path: img_path,
            what: format!("holds {}×{} images; MNIST-format data sets have 28×28 images", dims[1], dims[2]),
        }
        .into());
    }
    if dims[0] == 0 {
        return Err(DataError::Invalid {
            path: img_path,
            what: "holds no images (its header says 0)".into(),
        }
        .into());
    }
    let inputs = normalised(&pixels, [dims[0] as i64, 1, dims[1] as i64, dims[2] as i64], mean, std);
    let labels = Tensor::from_slice(&labels).to_kind(Kind::Int64);
    let max_label = labels.max().int64_value(&[]);
    if max_label > 9 {
        return Err(DataError::Invalid {
            path: lbl_path,
            what: format!("label {max_label} is out of range 0..9"),
        }
        .into());
    }
    Ok(Split::memory(inputs, labels, Augment::None))
}

/// libtorch's `(p / 255 − mean) / std` in float32 for each of the 256 pixel bytes.
/// Each op works element by element, so a byte's value here is the one the same ops
/// give it inside a whole split.
fn pixel_table(mean: f64, std: f64) -> Vec<f32> {
    let bytes: Vec<u8> = (0..=255).collect();
    let table = Tensor::from_slice(&bytes)
        .to_kind(Kind::Float)
        .divide_scalar(255.0)
        .g_sub_scalar(mean)
        .divide_scalar(std);
    Vec::<f32>::try_from(&table).expect("a float tensor of 256 elements reads back")
}

/// Pixel bytes to a float tensor of `shape`, normalised by `pixel_table`: one pass and
/// one tensor, where the ops on the whole split make three of four bytes per pixel each.
fn normalised(pixels: &[u8], shape: [i64; 4], mean: f64, std: f64) -> Tensor {
    let table = pixel_table(mean, std);
    let inputs = Tensor::empty(shape, (Kind::Float, tch::Device::Cpu));
    assert_eq!(
        inputs.numel(),
        pixels.len(),
        "the header's dimensions were checked against the bytes"
    );
    // SAFETY: `inputs` is a fresh contiguous float tensor of pixels.len() elements, owned
    // here and written only through this slice before it is returned.
    let out = unsafe { std::slice::from_raw_parts_mut(inputs.data_ptr() as *mut f32, pixels.len()) };
    for (value, &p) in out.iter_mut().zip(pixels) {
        *value = table[usize::from(p)];
    }
    inputs
}

/// MNIST or Fashion-MNIST from `data_dir` (Fashion-MNIST: Debian's package by default).
pub(crate) fn load(kind: DatasetKind, data_dir: Option<&Path>) -> Result<Dataset> {
    let (dir, hint, mean, std) = match (kind, data_dir) {
        (DatasetKind::FashionMnist, None) => (
            PathBuf::from(FASHION_MNIST_DIR),
            "Install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass --data-dir".to_string(),
            0.2860,
            0.3530,
        ),
        (DatasetKind::Mnist, None) => anyhow::bail!("--dataset mnist needs --data-dir DIR with the MNIST IDX files"),
        (_, None) => anyhow::bail!("--dataset {} is not an MNIST-format data set", dataset_name(kind)),
        (kind, Some(d)) => (
            d.to_path_buf(),
            "Check --data-dir: it must hold train-/t10k-images-idx3-ubyte and -labels-idx1-ubyte, gzipped or not".to_string(),
            if kind == DatasetKind::Mnist { 0.1307 } else { 0.2860 },
            if kind == DatasetKind::Mnist { 0.3081 } else { 0.3530 },
        ),
    };
    if !dir.is_dir() {
        return Err(DataError::Missing { path: dir, hint }.into());
    }
    let train = load_idx_split(&dir, "train", mean, std, &hint)?;
    let test = load_idx_split(&dir, "t10k", mean, std, &hint)?;
    Ok(Dataset {
        stream: None,
        name: dataset_name(kind),
        source: dir.display().to_string(),
        train,
        test,
        classes: 10,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's values are bit for bit those of the ops on a whole tensor, on a length
    /// that leaves a tail outside the vector loops, for both data sets' constants.
    #[test]
    fn the_pixel_table_matches_the_ops_on_a_whole_split() {
        let pixels: Vec<u8> = (0..28 * 28 * 7 + 3).map(|i| (i * 37 % 256) as u8).collect();
        for (mean, std) in [(0.2860, 0.3530), (0.1307, 0.3081)] {
            let ops = Tensor::from_slice(&pixels)
                .to_kind(Kind::Float)
                .divide_scalar(255.0)
                .g_sub_scalar(mean)
                .divide_scalar(std);
            let ops = Vec::<f32>::try_from(&ops).unwrap();
            let ours = Vec::<f32>::try_from(&normalised(&pixels, [pixels.len() as i64, 1, 1, 1], mean, std).view([-1])).unwrap();
            let differ = ops.iter().zip(&ours).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "mean {mean}: {differ} of {} values differ", ops.len());
            assert_eq!(ours[1].to_bits(), ops[1].to_bits());
        }
    }
}

//! CIFAR-10's binary version: records of 1 label byte and 3,072 pixel bytes.

use super::idx::DataError;
use super::{Augment, Dataset, Split};
use anyhow::Result;
use std::path::Path;
use tch::{Kind, Tensor};

/// CIFAR-10 binary version: records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32×32).
pub(crate) fn load_cifar10(dir: &Path) -> Result<Dataset> {
    const RECORD: usize = 1 + 3 * 32 * 32;
    let hint = "Point --data-dir at the extracted cifar-10-batches-bin folder";
    let read = |names: &[String]| -> Result<Split> {
        let mut pixels = Vec::new();
        let mut labels = Vec::new();
        for name in names {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(DataError::Missing { path, hint: hint.into() }.into());
            }
            let bytes = std::fs::read(&path).map_err(|e| DataError::Invalid {
                path: path.clone(),
                what: format!("cannot read: {e}"),
            })?;
            if bytes.is_empty() || bytes.len() % RECORD != 0 {
                return Err(DataError::Invalid {
                    path,
                    what: format!(
                        "{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records (truncated?)",
                        bytes.len()
                    ),
                }
                .into());
            }
            for (i, rec) in bytes.chunks(RECORD).enumerate() {
                if rec[0] > 9 {
                    return Err(DataError::Invalid {
                        path,
                        what: format!("record {i} has label {} (expected 0..9): not CIFAR-10 binary data", rec[0]),
                    }
                    .into());
                }
                labels.push(rec[0] as i64);
                pixels.extend_from_slice(&rec[1..]);
            }
        }
        let n = labels.len() as i64;
        let mean = Tensor::from_slice(&[0.4914f32, 0.4822, 0.4465]).view([1, 3, 1, 1]);
        let std = Tensor::from_slice(&[0.2470f32, 0.2435, 0.2616]).view([1, 3, 1, 1]);
        let inputs = (Tensor::from_slice(&pixels).view([n, 3, 32, 32]).to_kind(Kind::Float) / 255.0 - mean) / std;
        Ok(Split::memory(inputs, Tensor::from_slice(&labels), Augment::None))
    };
    let mut train = read(&(1..=5).map(|i| format!("data_batch_{i}.bin")).collect::<Vec<_>>())?;
    train.augment = Augment::CropFlip { pad: 4 };
    let test = read(&["test_batch.bin".to_string()])?;
    Ok(Dataset {
        stream: None,
        name: "cifar10".into(),
        source: dir.display().to_string(),
        train,
        test,
        classes: 10,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn cifar_dir(records_per_file: usize) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let names: Vec<String> = (1..=5)
            .map(|i| format!("data_batch_{i}.bin"))
            .chain(["test_batch.bin".to_string()])
            .collect();
        for (f, name) in names.iter().enumerate() {
            let mut bytes = Vec::new();
            for r in 0..records_per_file {
                bytes.push(((f + r) % 10) as u8);
                // Red plane 255, green 0, blue 128: checks the plane order.
                bytes.extend(std::iter::repeat_n(255u8, 1024));
                bytes.extend(std::iter::repeat_n(0u8, 1024));
                bytes.extend(std::iter::repeat_n(128u8, 1024));
            }
            std::fs::write(d.path().join(name), bytes).unwrap();
        }
        d
    }

    #[test]
    fn cifar10_reads_the_binary_format_and_augments() {
        let d = cifar_dir(3);
        let ds = load_cifar10(d.path()).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (15, 3, 10));
        assert_eq!(ds.train.inputs.size(), [15, 3, 32, 32]);
        assert_eq!(Vec::<i64>::try_from(&ds.test.labels).unwrap(), vec![5, 6, 7]);
        // Normalised per channel: red (1 - 0.4914)/0.2470, green -0.4822/0.2435.
        let px = |c: i64| ds.test.inputs.get(0).get(c).get(5).get(5).double_value(&[]);
        assert!((px(0) - (1.0 - 0.4914) / 0.2470).abs() < 1e-4);
        assert!((px(1) - (-0.4822 / 0.2435)).abs() < 1e-4);
        assert_eq!(ds.train.augment, Augment::CropFlip { pad: 4 });
        let _seeded = crate::torch_seed::seed(3);
        let (x, _) = ds
            .train
            .batch(&Tensor::from_slice(&[0i64, 1, 2, 3, 4, 5, 6, 7]), Device::Cpu)
            .unwrap();
        assert_eq!(x.size(), [8, 3, 32, 32]);
        // Crops shifted by up to 4 pixels bring zero padding into some images' borders.
        let original = ds.train.inputs.narrow(0, 0, 8);
        assert!(
            (x - original).abs().sum(Kind::Float).double_value(&[]) > 0.0,
            "augmentation changes pixels"
        );
        // A truncated file is named.
        let f = d.path().join("data_batch_3.bin");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() - 10]).unwrap();
        let e = load_cifar10(d.path()).err().unwrap().to_string();
        assert!(
            e.contains("data_batch_3.bin") && e.contains("not a whole number of 3073-byte"),
            "{e}"
        );
    }
}

//! ImageNet-style folders of JPEGs, decoded per batch with torchvision's
//! RandomResizedCrop + flip for training and resize 256 / centre crop 224 for validation.

use super::idx::DataError;
use super::{Augment, Dataset, Split};
use crate::stats::Rng;
use anyhow::Result;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// ImageNet's per-channel mean and standard deviation.
const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Decodes, crops and normalises the images `indices` of `files` into [N, 3, 224, 224].
pub(crate) fn decode_images(files: &[PathBuf], indices: &Tensor, how: Augment) -> Result<Tensor> {
    let idx = Vec::<i64>::try_from(indices)?;
    // One seed per batch from libtorch's (seeded) generator, then a cheap generator per image.
    let seed = Tensor::randint(i64::MAX, [1], (Kind::Int64, Device::Cpu)).int64_value(&[0]) as u64;
    let mut rng = Rng(seed);
    let images: Vec<Tensor> = idx
        .iter()
        .map(|&i| {
            let path = &files[i as usize];
            let img = tch::vision::image::load(path).map_err(|e| DataError::Invalid {
                path: path.clone(),
                what: format!("cannot decode image ({e}); remove or replace the file"),
            })?;
            let img = match img.size()[0] {
                1 => img.expand([3, -1, -1], false).contiguous(),
                3 => img,
                _ => img.narrow(0, 0, 3).contiguous(),
            };
            let (h, w) = (img.size()[1], img.size()[2]);
            let out = if how == Augment::ImageNetTrain {
                let (top, left, ch, cw) = random_resized_crop(h, w, &mut rng);
                let crop = img.narrow(1, top, ch).narrow(2, left, cw).contiguous();
                let r = tch::vision::image::resize(&crop, 224, 224)?;
                if rng.next_u64() & 1 == 1 {
                    r.flip([2])
                } else {
                    r
                }
            } else {
                let (nh, nw) = if h < w {
                    (256, (256 * w + h / 2) / h)
                } else {
                    ((256 * h + w / 2) / w, 256)
                };
                let r = tch::vision::image::resize(&img, nw, nh)?;
                r.narrow(1, (nh - 224) / 2, 224).narrow(2, (nw - 224) / 2, 224)
            };
            Ok(out)
        })
        .collect::<Result<_>>()?;
    let mean = Tensor::from_slice(&IMAGENET_MEAN).view([1, 3, 1, 1]);
    let std = Tensor::from_slice(&IMAGENET_STD).view([1, 3, 1, 1]);
    Ok((Tensor::stack(&images, 0).to_kind(Kind::Float) / 255.0 - mean) / std)
}

/// torchvision's RandomResizedCrop box (top, left, height, width) for an h×w image.
pub fn random_resized_crop(h: i64, w: i64, rng: &mut Rng) -> (i64, i64, i64, i64) {
    let area = (h * w) as f64;
    let uniform = |rng: &mut Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    for _ in 0..10 {
        let target = area * (0.08 + 0.92 * uniform(rng));
        let log_ratio = (3f64 / 4.0).ln() + ((4f64 / 3.0).ln() - (3f64 / 4.0).ln()) * uniform(rng);
        let ratio = log_ratio.exp();
        let cw = (target * ratio).sqrt().round() as i64;
        let ch = (target / ratio).sqrt().round() as i64;
        if cw > 0 && ch > 0 && cw <= w && ch <= h {
            let top = rng.below((h - ch + 1) as u64) as i64;
            let left = rng.below((w - cw + 1) as u64) as i64;
            return (top, left, ch, cw);
        }
    }
    (0, 0, h, w)
}

/// An ImageNet-style folder: `train/<class>/*.JPEG` and `val/<class>/*.JPEG`; classes
/// are the sorted names of train's sub-folders. Images stay on disk and are decoded
/// per batch (on `--workers` threads).
pub fn load_image_folder(dir: &Path) -> Result<Dataset> {
    let hint = "--data-dir must hold train/<class>/*.JPEG and val/<class>/*.JPEG (ImageNet layout)";
    let train_dir = dir.join("train");
    if !train_dir.is_dir() {
        return Err(DataError::Missing {
            path: train_dir,
            hint: hint.into(),
        }
        .into());
    }
    let mut classes: Vec<String> = std::fs::read_dir(&train_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    classes.sort();
    if classes.is_empty() {
        return Err(DataError::Invalid {
            path: train_dir,
            what: format!("has no class folders. {hint}"),
        }
        .into());
    }
    let list = |split: &str, augment: Augment| -> Result<Split> {
        let mut files = Vec::new();
        let mut labels = Vec::new();
        for (c, class) in classes.iter().enumerate() {
            let folder = dir.join(split).join(class);
            if !folder.is_dir() {
                continue;
            }
            let mut imgs: Vec<PathBuf> = std::fs::read_dir(&folder)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .is_some_and(|x| ["jpeg", "jpg", "png"].contains(&x.to_string_lossy().to_lowercase().as_str()))
                })
                .collect();
            imgs.sort();
            labels.extend(std::iter::repeat(c as i64).take(imgs.len()));
            files.extend(imgs);
        }
        if files.is_empty() {
            return Err(DataError::Invalid {
                path: dir.join(split),
                what: format!("holds no .JPEG/.jpg/.png images. {hint}"),
            }
            .into());
        }
        Ok(Split::files(files, Tensor::from_slice(&labels), augment))
    };
    let train = list("train", Augment::ImageNetTrain)?;
    let test = list("val", Augment::ImageNetEval)?;
    Ok(Dataset {
        stream: None,
        name: "imagenet".into(),
        source: dir.display().to_string(),
        train,
        test,
        classes: classes.len() as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ImageNet-style folder of real JPEGs: 2 classes, images of several sizes.
    fn image_folder() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (split, per_class) in [("train", 3), ("val", 2)] {
            for class in ["n01440764", "n02102040"] {
                let folder = d.path().join(split).join(class);
                std::fs::create_dir_all(&folder).unwrap();
                for i in 0..per_class {
                    let (h, w) = [(300, 400), (256, 256), (500, 260)][i];
                    let img = Tensor::randint(256, [3, h, w], (Kind::Uint8, Device::Cpu));
                    tch::vision::image::save(&img, folder.join(format!("img{i}.jpg"))).unwrap();
                    std::fs::rename(folder.join(format!("img{i}.jpg")), folder.join(format!("img{i}.JPEG"))).unwrap();
                }
            }
        }
        // A grayscale image is widened to 3 channels.
        let gray = Tensor::randint(256, [1, 240, 320], (Kind::Uint8, Device::Cpu));
        tch::vision::image::save(&gray, d.path().join("val/n02102040/gray.png")).unwrap();
        d
    }

    #[test]
    fn image_folder_decodes_crops_and_labels() {
        let d = image_folder();
        let ds = load_image_folder(d.path()).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (6, 5, 2));
        assert_eq!(Vec::<i64>::try_from(&ds.train.labels).unwrap(), vec![0, 0, 0, 1, 1, 1]);
        let all = Tensor::from_slice(&[0i64, 1, 2, 3, 4]);
        let (x, y) = ds.test.batch(&all, Device::Cpu).unwrap();
        assert_eq!(x.size(), [5, 3, 224, 224]);
        assert_eq!(Vec::<i64>::try_from(&y).unwrap(), vec![0, 0, 1, 1, 1]);
        // Validation is deterministic; training crops are random.
        let (x2, _) = ds.test.batch(&all, Device::Cpu).unwrap();
        assert!(x.equal(&x2));
        let (t1, _) = ds.train.batch(&all, Device::Cpu).unwrap();
        let (t2, _) = ds.train.batch(&all, Device::Cpu).unwrap();
        assert_eq!(t1.size(), [5, 3, 224, 224]);
        assert!(!t1.equal(&t2));
        // Normalised with ImageNet statistics: values of uniform noise stay within about ±2.7.
        assert!(x.abs().max().double_value(&[]) < 2.7);
        // A corrupt file is named.
        std::fs::write(d.path().join("val/n01440764/img0.JPEG"), b"not a jpeg").unwrap();
        let e = ds.test.batch(&all, Device::Cpu).err().unwrap().to_string();
        assert!(e.contains("img0.JPEG") && e.contains("cannot decode image"), "{e}");
    }

    #[test]
    fn random_resized_crop_stays_inside_the_image() {
        let mut rng = Rng(9);
        for _ in 0..1000 {
            let (t, l, h, w) = random_resized_crop(300, 500, &mut rng);
            assert!(t >= 0 && l >= 0 && h > 0 && w > 0 && t + h <= 300 && l + w <= 500);
            let frac = (h * w) as f64 / 150_000.0;
            assert!(frac > 0.07 && frac <= 1.0 + 1e-9);
        }
    }
}

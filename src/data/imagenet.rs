//! ImageNet-style folders of JPEGs, decoded per batch with torchvision's
//! RandomResizedCrop + flip for training and resize 256 / centre crop 224 for validation.

use super::idx::DataError;
use super::image_caps::{self, ImageCaps};
use super::jpeg;
use super::resample::{resample_into, Normalize, Taps};
use super::{Augment, Dataset, Split};
use crate::stats::Rng;
use anyhow::Result;
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// ImageNet's per-channel mean and standard deviation.
const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The side of a prepared image.
pub(crate) const CROP: usize = 224;
/// Validation resizes the shorter side to this, then keeps the centre CROP × CROP.
pub(crate) const RESIZE: usize = 256;

/// Where one prepared image's pixels come from: the box `[x0, y0, x1, y1]` of the
/// original image (pixels) is resized to `out_w` × `out_h`, of which the CROP × CROP
/// window at (`win_x`, `win_y`) is kept, mirrored when `flip`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Geometry {
    pub bbox: [f64; 4],
    pub out_w: usize,
    pub out_h: usize,
    pub win_x: usize,
    pub win_y: usize,
    pub flip: bool,
}

/// torchvision's RandomResizedCrop(224) and RandomHorizontalFlip for an h×w image.
pub(crate) fn train_geometry(h: usize, w: usize, rng: &mut Rng) -> Geometry {
    let (top, left, ch, cw) = random_resized_crop(h as i64, w as i64, rng);
    Geometry {
        bbox: [left as f64, top as f64, (left + cw) as f64, (top + ch) as f64],
        out_w: CROP,
        out_h: CROP,
        win_x: 0,
        win_y: 0,
        flip: rng.next_u64() & 1 == 1,
    }
}

/// torchvision's Resize(256) then CenterCrop(224) for an h×w image: the shorter side
/// becomes 256 and the longer one int(256 · long / short); the window starts at
/// round((side − 224) / 2), halves rounded to even as Python's round does.
pub(crate) fn eval_geometry(h: usize, w: usize) -> Geometry {
    let (out_w, out_h) = if w <= h {
        (RESIZE, RESIZE * h / w)
    } else {
        (RESIZE * w / h, RESIZE)
    };
    let centre = |side: usize| {
        let d = side.saturating_sub(CROP);
        let half = d / 2;
        if d % 2 == 1 && half % 2 == 1 {
            half + 1
        } else {
            half
        }
    };
    Geometry {
        bbox: [0.0, 0.0, w as f64, h as f64],
        out_w,
        out_h,
        win_x: centre(out_w),
        win_y: centre(out_h),
        flip: false,
    }
}

/// The DCT-domain scale 1/d to decode at: the largest d of 8, 4, 2, 1 that leaves the
/// box at least as many pixels as its resized size along both axes, so no resolution
/// the output can hold is lost.
pub(crate) fn dct_scale(g: &Geometry) -> usize {
    let (bw, bh) = (g.bbox[2] - g.bbox[0], g.bbox[3] - g.bbox[1]);
    [8usize, 4, 2]
        .into_iter()
        .find(|&d| bw / d as f64 >= g.out_w as f64 && bh / d as f64 >= g.out_h as f64)
        .unwrap_or(1)
}

/// How an image's pixels are had: a JPEG region decoded on demand, or a whole image
/// decoded by libtorch's decoder (PNG, and anything else it reads).
enum Source<'a> {
    Jpeg(&'a [u8]),
    Pixels(Vec<u8>),
}

/// Decodes `bytes` (a JPEG or any format libtorch reads), applies `how` and writes the
/// normalised 3 × 224 × 224 result into `out`. The image's size is read from its header
/// and checked against `caps` before anything is decoded.
pub(crate) fn prepare_image(bytes: &[u8], how: Augment, rng: &mut Rng, out: &mut [f32], caps: &ImageCaps) -> Result<(), String> {
    let (w, h, source) = if jpeg::is_jpeg(bytes) {
        let hd = jpeg::header(bytes).map_err(|e| e.to_string())?;
        caps.check_pixels(hd.width, hd.height)?;
        (hd.width, hd.height, Source::Jpeg(bytes))
    } else {
        let (w, h) = other_header(bytes)?;
        caps.check_pixels(w, h)?;
        let (w, h, px) = decode_other(bytes)?;
        (w, h, Source::Pixels(px))
    };
    if w == 0 || h == 0 {
        return Err("the image has no pixels".into());
    }
    let g = match how {
        Augment::ImageNetEval => eval_geometry(h, w),
        _ => train_geometry(h, w, rng),
    };
    let d = match source {
        Source::Jpeg(_) => dct_scale(&g),
        Source::Pixels(_) => 1,
    };
    let (ws, hs) = (jpeg::scaled_len(w, d), jpeg::scaled_len(h, d));
    let b = g.bbox.map(|v| v / d as f64);
    let cols = Taps::new(ws, b[0], b[2], g.out_w, g.win_x, CROP);
    let rows = Taps::new(hs, b[1], b[3], g.out_h, g.win_y, CROP);
    let ((x0, x1), (y0, y1)) = (cols.span(), rows.span());
    let region = match source {
        Source::Jpeg(bytes) => jpeg::decode_region(bytes, d, x0, y0, x1 - x0, y1 - y0).map_err(|e| e.to_string())?,
        Source::Pixels(px) => px
            .chunks(w * 3)
            .skip(y0)
            .take(y1 - y0)
            .flat_map(|row| &row[x0 * 3..x1 * 3])
            .copied()
            .collect(),
    };
    let norm = Normalize::new(IMAGENET_MEAN, IMAGENET_STD);
    resample_into(&region, x1 - x0, &rows.shifted(y0), &cols.shifted(x0), norm, g.flip, out);
    Ok(())
}

extern "C" {
    // stb_image, the decoder libtorch's image loading (tch) is built with.
    fn stbi_info_from_memory(buffer: *const u8, len: c_int, x: *mut c_int, y: *mut c_int, comp: *mut c_int) -> c_int;
    fn stbi_failure_reason() -> *const c_char;
}

/// The width and height a non-JPEG image's header declares, read by the decoder that
/// [`decode_other`] uses, without decoding it.
fn other_header(bytes: &[u8]) -> Result<(usize, usize), String> {
    let unread = |why: String| format!("not a JPEG, and no other decoder reads it ({why})");
    let len =
        c_int::try_from(bytes.len()).map_err(|_| unread(format!("{} bytes: its decoder reads at most {}", bytes.len(), c_int::MAX)))?;
    let (mut w, mut h, mut c) = (0, 0, 0);
    // SAFETY: stb reads `bytes` within `len` and writes the three integers.
    if unsafe { stbi_info_from_memory(bytes.as_ptr(), len, &mut w, &mut h, &mut c) } == 0 {
        // SAFETY: stb's failure reason is a static string (or null).
        let reason = unsafe { stbi_failure_reason() };
        let why = if reason.is_null() {
            "unknown image type".into()
        } else {
            unsafe { std::ffi::CStr::from_ptr(reason) }.to_string_lossy().into_owned()
        };
        return Err(unread(why));
    }
    Ok((w.max(0) as usize, h.max(0) as usize))
}

/// A non-JPEG image through libtorch's decoder, as packed RGB.
fn decode_other(bytes: &[u8]) -> Result<(usize, usize, Vec<u8>), String> {
    let img = tch::vision::image::load_from_memory(bytes).map_err(|e| format!("not a JPEG, and no other decoder reads it ({e})"))?;
    let img = match img.size()[0] {
        1 => img.expand([3, -1, -1], false),
        3 => img,
        _ => img.narrow(0, 0, 3),
    };
    let (h, w) = (img.size()[1] as usize, img.size()[2] as usize);
    let px = Vec::<u8>::try_from(img.permute([1, 2, 0]).contiguous().view([-1])).map_err(|e| e.to_string())?;
    Ok((w, h, px))
}

/// Reads the image file `path` within `caps` and prepares it into `out` (as
/// [`prepare_image`]); a file that cannot be read, is over a cap or does not decode is named.
pub(crate) fn load_image(path: &Path, how: Augment, rng: &mut Rng, out: &mut [f32], caps: &ImageCaps) -> Result<(), DataError> {
    let bytes = caps.read(path)?;
    prepare_image(&bytes, how, rng, out, caps).map_err(|e| image_caps::refused(path, &e))
}

/// Decodes, crops and normalises the images `indices` of `files` into [N, 3, 224, 224],
/// in page-locked memory for the CUDA device `pin` when given; each file within `caps`.
pub(crate) fn decode_images(files: &[PathBuf], indices: &Tensor, how: Augment, pin: Option<Device>, caps: &ImageCaps) -> Result<Tensor> {
    let idx = Vec::<i64>::try_from(indices)?;
    // One seed per batch from libtorch's (seeded) generator, then a cheap generator per image.
    let seed = Tensor::randint(i64::MAX, [1], (Kind::Int64, Device::Cpu)).int64_value(&[0]) as u64;
    let mut rng = Rng(seed);
    let per = 3 * CROP * CROP;
    let mut x = Tensor::empty([idx.len() as i64, 3, CROP as i64, CROP as i64], (Kind::Float, Device::Cpu));
    if let Some(d) = pin {
        // The pages of a fresh tensor are untouched, so this copy reads no image data.
        x = x.pin_memory(d);
    }
    // SAFETY: `x` is a fresh contiguous host float tensor of idx.len() × per elements,
    // owned here and written only through this slice until it is returned.
    let all = unsafe { std::slice::from_raw_parts_mut(x.data_ptr() as *mut f32, idx.len() * per) };
    for (&i, out) in idx.iter().zip(all.chunks_mut(per)) {
        load_image(&files[i as usize], how, &mut rng, out, caps)?;
    }
    Ok(x)
}

/// torchvision's RandomResizedCrop box (top, left, height, width) for an h×w image
/// (scale 0.08–1, ratio 3/4–4/3, 10 tries, then the centre crop clamped to the ratio).
pub(crate) fn random_resized_crop(h: i64, w: i64, rng: &mut Rng) -> (i64, i64, i64, i64) {
    let area = (h * w) as f64;
    let uniform = |rng: &mut Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let (lo, hi) = (3f64 / 4.0, 4f64 / 3.0);
    for _ in 0..10 {
        let target = area * (0.08 + 0.92 * uniform(rng));
        let log_ratio = lo.ln() + (hi.ln() - lo.ln()) * uniform(rng);
        let ratio = log_ratio.exp();
        let cw = (target * ratio).sqrt().round() as i64;
        let ch = (target / ratio).sqrt().round() as i64;
        if cw > 0 && ch > 0 && cw <= w && ch <= h {
            let top = rng.below((h - ch + 1) as u64) as i64;
            let left = rng.below((w - cw + 1) as u64) as i64;
            return (top, left, ch, cw);
        }
    }
    let in_ratio = w as f64 / h as f64;
    let (cw, ch) = if in_ratio < lo {
        (w, (w as f64 / lo).round() as i64)
    } else if in_ratio > hi {
        ((h as f64 * hi).round() as i64, h)
    } else {
        (w, h)
    };
    ((h - ch) / 2, (w - cw) / 2, ch, cw)
}

/// An ImageNet-style folder: `train/<class>/*.JPEG` and `val/<class>/*.JPEG`; classes
/// are the sorted names of train's sub-folders. Images stay on disk and are decoded
/// per batch (on `--workers` threads), each file within `caps`.
pub(crate) fn load_image_folder(dir: &Path, caps: ImageCaps) -> Result<Dataset> {
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
            labels.extend(std::iter::repeat_n(c as i64, imgs.len()));
            files.extend(imgs);
        }
        if files.is_empty() {
            return Err(DataError::Invalid {
                path: dir.join(split),
                what: format!("holds no .JPEG/.jpg/.png images. {hint}"),
            }
            .into());
        }
        Ok(Split::files(files, Tensor::from_slice(&labels), augment, caps))
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
        let ds = load_image_folder(d.path(), ImageCaps::default()).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (6, 5, 2));
        assert_eq!(ds.test.sample_bytes(), 3 * 224 * 224 * 4);
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

    /// A photo-like w×h RGB image: smooth gradients and waves, mild seeded noise.
    fn photo(w: usize, h: usize, seed: u64) -> Vec<u8> {
        let mut rng = Rng(seed);
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f64 / w as f64, y as f64 / h as f64);
                for c in 0..3 {
                    let wave = ((fx * (3.0 + c as f64) + fy * 2.0) * std::f64::consts::PI).sin();
                    let v = 60.0 + 120.0 * fx * fy + 50.0 * wave + (rng.below(9) as f64 - 4.0);
                    px.push(v.clamp(0.0, 255.0) as u8);
                }
            }
        }
        px
    }

    fn prepared(bytes: &[u8], how: Augment, seed: u64) -> Vec<f32> {
        let mut out = vec![0f32; 3 * CROP * CROP];
        prepare_image(bytes, how, &mut Rng(seed), &mut out, &ImageCaps::default()).unwrap();
        out
    }

    #[test]
    fn crop_geometry_matches_torchvision_by_hand() {
        // Validation of a 500×375 photo: shorter side 375 → 256, longer int(256·500/375) = 341;
        // window left round(117/2) = round(58.5) = 58 (to even), top (256-224)/2 = 16.
        let g = eval_geometry(375, 500);
        assert_eq!((g.out_w, g.out_h, g.win_x, g.win_y), (341, 256, 58, 16));
        assert_eq!(g.bbox, [0.0, 0.0, 500.0, 375.0]);
        // 343 wide: round(59.5) = 60.
        assert_eq!(eval_geometry(256, 343).win_x, 60);
        // Portrait 375×500: 256 wide, int(256·500/375) = 341 high.
        let g = eval_geometry(500, 375);
        assert_eq!((g.out_w, g.out_h, g.win_x, g.win_y), (256, 341, 16, 58));
        // A 10×1000 strip: every try needs a crop at least sqrt(800·3/4) ≈ 24.5 high, so
        // all 10 fail and the centre crop at ratio 4/3 is taken: 13 wide, 10 high,
        // at left (1000 - 13) / 2 = 493.
        let mut rng = Rng(1);
        assert_eq!(random_resized_crop(10, 1000, &mut rng), (0, 493, 10, 13));
        // 1000×10 (tall): width 10, height round(10 / (3/4)) = 13, top 493.
        assert_eq!(random_resized_crop(1000, 10, &mut rng), (493, 0, 13, 10));
        // The train geometry resizes exactly the crop to 224×224.
        let mut a = Rng(7);
        let mut b = Rng(7);
        let g = train_geometry(375, 500, &mut a);
        let (t, l, h, w) = random_resized_crop(375, 500, &mut b);
        assert_eq!(g.bbox, [l as f64, t as f64, (l + w) as f64, (t + h) as f64]);
        assert_eq!((g.out_w, g.out_h, g.win_x, g.win_y), (224, 224, 0, 0));
    }

    #[test]
    fn the_dct_scale_is_chosen_only_when_it_loses_no_resolution() {
        let crop = |w: f64, h: f64| Geometry {
            bbox: [10.0, 20.0, 10.0 + w, 20.0 + h],
            out_w: 224,
            out_h: 224,
            win_x: 0,
            win_y: 0,
            flip: false,
        };
        assert_eq!(dct_scale(&crop(448.0, 448.0)), 2);
        assert_eq!(dct_scale(&crop(447.0, 900.0)), 1);
        assert_eq!(dct_scale(&crop(900.0, 900.0)), 4);
        assert_eq!(dct_scale(&crop(1792.0, 1800.0)), 8);
        assert_eq!(dct_scale(&crop(300.0, 200.0)), 1);
        // Validation: 500×375 → 341×256 keeps full resolution; 1024×768 → 341×256 from
        // 512×384 at 1/2 (1/4 would leave 192 rows for 256).
        assert_eq!(dct_scale(&eval_geometry(375, 500)), 1);
        assert_eq!(dct_scale(&eval_geometry(768, 1024)), 2);
    }

    #[test]
    fn decoded_pixels_match_a_reference_decoder_and_regions_match_the_whole() {
        let (w, h) = (333, 250);
        let px = photo(w, h, 3);
        let bytes = jpeg::encode(&px, w, h, 3, 90).unwrap();
        assert_eq!(
            jpeg::header(&bytes).unwrap(),
            jpeg::Header {
                width: w,
                height: h,
                components: 3
            }
        );
        let whole = jpeg::decode_region(&bytes, 1, 0, 0, w, h).unwrap();
        // libtorch's own decoder (stb_image) on the same file: a few levels apart at most
        // on average (different IDCT and chroma upsampling).
        let reference = tch::vision::image::load_from_memory(&bytes)
            .unwrap()
            .permute([1, 2, 0])
            .contiguous();
        let reference = Vec::<u8>::try_from(reference.view([-1])).unwrap();
        let diff: Vec<i32> = whole.iter().zip(&reference).map(|(&a, &b)| (a as i32 - b as i32).abs()).collect();
        let mean = diff.iter().sum::<i32>() as f64 / diff.len() as f64;
        assert!(mean < 1.5, "mean |difference| {mean}");
        // And the image written: JPEG at quality 90 stays within a few levels of it.
        let err = whole.iter().zip(&px).map(|(&a, &b)| (a as i32 - b as i32).abs()).sum::<i32>() as f64 / px.len() as f64;
        assert!(err < 4.0, "mean |error| {err}");
        // A region (partial decode: cropped iMCU columns, skipped rows) is exactly the
        // same pixels as the whole image's, at any offset, and likewise at 1/2 scale.
        // Offsets on iMCU boundaries (16, 32) are where chroma upsampling at a crop edge differs.
        for (x, y, rw, rh) in [
            (0, 0, 17, 9),
            (16, 16, 32, 40),
            (32, 48, 100, 30),
            (37, 101, 120, 64),
            (w - 50, h - 33, 50, 33),
            (5, 3, w - 5, h - 3),
        ] {
            let region = jpeg::decode_region(&bytes, 1, x, y, rw, rh).unwrap();
            for r in 0..rh {
                assert_eq!(
                    region[r * rw * 3..(r + 1) * rw * 3],
                    whole[((y + r) * w + x) * 3..((y + r) * w + x + rw) * 3],
                    "row {r}"
                );
            }
        }
        let (ws, hs) = (jpeg::scaled_len(w, 2), jpeg::scaled_len(h, 2));
        let half = jpeg::decode_region(&bytes, 2, 0, 0, ws, hs).unwrap();
        let region = jpeg::decode_region(&bytes, 2, 30, 40, 60, 50).unwrap();
        for r in 0..50 {
            assert_eq!(
                region[r * 180..(r + 1) * 180],
                half[((40 + r) * ws + 30) * 3..((40 + r) * ws + 90) * 3]
            );
        }
        // Outside the image: refused.
        assert!(jpeg::decode_region(&bytes, 1, w - 10, 0, 11, 1).is_err());
    }

    #[test]
    fn the_partial_decode_gives_what_the_whole_image_gives() {
        // The same pixels as a PNG take the whole-image path; the JPEG takes the region
        // path. Where no DCT scaling applies the results agree to rounding.
        let (w, h) = (400, 300);
        let bytes = jpeg::encode(&photo(w, h, 5), w, h, 3, 90).unwrap();
        let whole = jpeg::decode_region(&bytes, 1, 0, 0, w, h).unwrap();
        let png = {
            let d = tempfile::tempdir().unwrap();
            let t = Tensor::from_slice(&whole).view([h as i64, w as i64, 3]).permute([2, 0, 1]);
            tch::vision::image::save(&t, d.path().join("x.png")).unwrap();
            std::fs::read(d.path().join("x.png")).unwrap()
        };
        for seed in 0..20 {
            let a = prepared(&bytes, Augment::ImageNetTrain, seed);
            let b = prepared(&png, Augment::ImageNetTrain, seed);
            let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-4, "seed {seed}: {worst}");
        }
        let a = prepared(&bytes, Augment::ImageNetEval, 0);
        let b = prepared(&png, Augment::ImageNetEval, 0);
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-4));
        // A large image decoded at 1/2 for validation (1000×800 → 320×256 from 500×400)
        // stays close to the full-resolution result: within 0.1 (of about ±2.5) on average.
        let (w, h) = (1000, 800);
        let bytes = jpeg::encode(&photo(w, h, 6), w, h, 3, 90).unwrap();
        assert_eq!(dct_scale(&eval_geometry(h, w)), 2);
        let whole = jpeg::decode_region(&bytes, 1, 0, 0, w, h).unwrap();
        let mut full = vec![0f32; 3 * CROP * CROP];
        let g = eval_geometry(h, w);
        let cols = Taps::new(w, 0.0, w as f64, g.out_w, g.win_x, CROP);
        let rows = Taps::new(h, 0.0, h as f64, g.out_h, g.win_y, CROP);
        resample_into(
            &whole,
            w,
            &rows,
            &cols,
            Normalize::new(IMAGENET_MEAN, IMAGENET_STD),
            false,
            &mut full,
        );
        let scaled = prepared(&bytes, Augment::ImageNetEval, 0);
        let mean = scaled.iter().zip(&full).map(|(x, y)| (x - y).abs()).sum::<f32>() / full.len() as f32;
        assert!(mean < 0.1, "mean |difference| {mean}");
    }

    #[test]
    fn grayscale_cmyk_png_and_bad_files() {
        let (w, h) = (64, 48);
        // Grayscale comes out with three equal channels (before normalisation).
        let gray: Vec<u8> = (0..w * h).map(|i| (i % 200) as u8 + 20).collect();
        let g = jpeg::encode(&gray, w, h, 1, 95).unwrap();
        assert_eq!(jpeg::header(&g).unwrap().components, 1);
        let px = jpeg::decode_region(&g, 1, 0, 0, w, h).unwrap();
        assert!(px.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
        // CMYK with an Adobe marker (inverted, as Photoshop writes): R = C·K/255.
        let cmyk: Vec<u8> = [200u8, 100, 50, 128].repeat(w * h);
        let c = jpeg::encode(&cmyk, w, h, 4, 100).unwrap();
        let px = jpeg::decode_region(&c, 1, 0, 0, w, h).unwrap();
        let want = [200 * 128 / 255, 100 * 128 / 255, 50 * 128 / 255];
        for p in px.chunks(3) {
            for ch in 0..3 {
                assert!((p[ch] as i32 - want[ch]).abs() <= 3, "{p:?} vs {want:?}");
            }
        }
        prepared(&c, Augment::ImageNetTrain, 1);
        // A truncated file is refused by name; garbage is named as not an image.
        let rgb = jpeg::encode(&photo(w, h, 9), w, h, 3, 90).unwrap();
        let mut out = vec![0f32; 3 * CROP * CROP];
        let e = prepare_image(
            &rgb[..rgb.len() / 2],
            Augment::ImageNetEval,
            &mut Rng(0),
            &mut out,
            &ImageCaps::default(),
        )
        .unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        let e = prepare_image(
            b"not an image at all",
            Augment::ImageNetEval,
            &mut Rng(0),
            &mut out,
            &ImageCaps::default(),
        )
        .unwrap_err();
        assert!(e.contains("not a JPEG"), "{e}");
        let e = prepare_image(
            &[0xFF, 0xD8, 0xFF, 0xE0, 0, 16, 1, 2],
            Augment::ImageNetEval,
            &mut Rng(0),
            &mut out,
            &ImageCaps::default(),
        )
        .unwrap_err();
        assert!(e.contains("JPEG"), "{e}");
    }

    /// `bytes` (a JPEG) with the frame header's (SOF's) size set to `w`×`h`.
    fn forge_size(bytes: &[u8], w: u16, h: u16) -> Vec<u8> {
        let mut b = bytes.to_vec();
        let mut at = 2;
        // Segments from the start-of-image marker on: FF, marker, 2-byte length.
        while !matches!(b[at + 1], 0xC0 | 0xC2) {
            at += 2 + u16::from_be_bytes([b[at + 2], b[at + 3]]) as usize;
        }
        b[at + 5..at + 7].copy_from_slice(&h.to_be_bytes());
        b[at + 7..at + 9].copy_from_slice(&w.to_be_bytes());
        b
    }

    /// A line of /proc/self/status in KiB (VmRSS: now; VmHWM: the peak since the last reset).
    fn status_kib(key: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_forged_header_over_the_pixel_cap_is_refused_before_decoding() {
        // A progressive 64×64 JPEG whose header claims 30000×30000: decoding it would
        // allocate the whole image's coefficients (30000² × 1.5 samples × 2 bytes = 2.7 GB).
        let (w, h) = (64, 64);
        let small = jpeg::encode_as(&photo(w, h, 4), w, h, 3, 90, true).unwrap();
        let forged = forge_size(&small, 30000, 30000);
        assert_eq!(
            (jpeg::header(&forged).unwrap().width, jpeg::header(&forged).unwrap().height),
            (30000, 30000)
        );
        let mut out = vec![0f32; 3 * CROP * CROP];
        // Resets the peak resident set (VmHWM) to what is resident now.
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kib("VmRSS");
        let result = prepare_image(&forged, Augment::ImageNetEval, &mut Rng(0), &mut out, &ImageCaps::default());
        let grown_kib = status_kib("VmHWM").saturating_sub(before);
        assert!(grown_kib < 256 << 10, "the peak resident set grew by {grown_kib} KiB");
        let e = result.unwrap_err();
        assert!(e.contains("30000×30000") && e.contains("--max-image-pixels 178956970"), "{e}");
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

//! Bilinear resampling with antialiasing, as Pillow's `Image.resize(..., BILINEAR)` (what
//! torchvision's Resize and RandomResizedCrop call on images): a triangle filter whose
//! support widens with the reduction factor, weights normalised per output pixel. The
//! two passes run in f32 without rounding in between, and the second one writes the
//! normalised, channel-planar result (and the horizontal flip) straight into a batch.

/// The input pixels and weights of each output pixel along one axis.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Taps {
    /// First input pixel of each output pixel.
    pub start: Vec<usize>,
    /// Number of input pixels of each output pixel.
    pub len: Vec<usize>,
    /// Weights, `ksize` per output pixel (the first `len` used).
    pub weights: Vec<f32>,
    pub ksize: usize,
}

impl Taps {
    /// Output pixels `from..from + count` of resampling input pixels `in0..in1` (fractional
    /// edges allowed) of an axis of `in_size` pixels onto `out_size` pixels. Pillow's
    /// coefficients: centre = in0 + (i + 0.5)·scale, support = max(scale, 1), weights
    /// triangle((j + 0.5 − centre) / max(scale, 1)).
    pub(crate) fn new(in_size: usize, in0: f64, in1: f64, out_size: usize, from: usize, count: usize) -> Taps {
        let scale = (in1 - in0) / out_size as f64;
        let support = scale.max(1.0);
        let ksize = support.ceil() as usize * 2 + 1;
        let mut t = Taps {
            start: Vec::with_capacity(count),
            len: Vec::with_capacity(count),
            weights: vec![0.0; count * ksize],
            ksize,
        };
        let mut w = vec![0f64; ksize];
        for (k, i) in (from..from + count).enumerate() {
            let centre = in0 + (i as f64 + 0.5) * scale;
            let lo = ((centre - support + 0.5) as i64).max(0) as usize;
            let hi = ((centre + support + 0.5) as i64).clamp(0, in_size as i64) as usize;
            let n = hi.saturating_sub(lo).min(ksize);
            let mut total = 0.0;
            for (j, wj) in w.iter_mut().enumerate().take(n) {
                let x = ((j + lo) as f64 - centre + 0.5) / support;
                *wj = (1.0 - x.abs()).max(0.0);
                total += *wj;
            }
            for (tw, &wj) in t.weights[k * ksize..k * ksize + n].iter_mut().zip(&w) {
                *tw = if total != 0.0 { (wj / total) as f32 } else { 0.0 };
            }
            t.start.push(lo);
            t.len.push(n);
        }
        t
    }

    /// The input pixels any output pixel reads: `lo..hi`.
    pub(crate) fn span(&self) -> (usize, usize) {
        let lo = self.start.iter().copied().min().unwrap_or(0);
        let hi = self.start.iter().zip(&self.len).map(|(s, l)| s + l).max().unwrap_or(0);
        (lo, hi)
    }

    /// The same taps with input positions counted from `offset`.
    pub(crate) fn shifted(mut self, offset: usize) -> Taps {
        for s in &mut self.start {
            *s -= offset;
        }
        self
    }
}

/// Per-channel affine map from 0..255 pixel values: v·scale\[c\] + shift\[c\].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Normalize {
    pub scale: [f32; 3],
    pub shift: [f32; 3],
}

impl Normalize {
    /// (v/255 − mean) / std, as ToTensor then Normalize(mean, std).
    pub(crate) fn new(mean: [f32; 3], std: [f32; 3]) -> Normalize {
        Normalize {
            scale: [0, 1, 2].map(|c| 1.0 / (255.0 * std[c])),
            shift: [0, 1, 2].map(|c| -mean[c] / std[c]),
        }
    }
}

/// Resamples packed RGB `src` (`width` pixels per row) with `rows` and `cols` taps
/// (positions within `src`) into `out`: 3 planes of rows.len() × cols.len() f32,
/// normalised, mirrored left-right when `flip`.
pub(crate) fn resample_into(src: &[u8], width: usize, rows: &Taps, cols: &Taps, norm: Normalize, flip: bool, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { resample_avx2(src, width, rows, cols, norm, flip, out) };
        }
    }
    resample_generic(src, width, rows, cols, norm, flip, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn resample_avx2(src: &[u8], width: usize, rows: &Taps, cols: &Taps, norm: Normalize, flip: bool, out: &mut [f32]) {
    resample_generic(src, width, rows, cols, norm, flip, out)
}

#[inline(always)]
fn resample_generic(src: &[u8], width: usize, rows: &Taps, cols: &Taps, norm: Normalize, flip: bool, out: &mut [f32]) {
    let (oh, ow) = (rows.start.len(), cols.start.len());
    assert_eq!(out.len(), 3 * oh * ow, "output is 3 × {oh} × {ow}");
    // Only the columns some output pixel reads.
    let (c0, c1) = cols.span();
    let n = (c1 - c0) * 3;
    let mut line = vec![0f32; n];
    let plane = oh * ow;
    for y in 0..oh {
        // Vertical pass: one row of the columns c0..c1, all channels, in f32.
        line.iter_mut().for_each(|v| *v = 0.0);
        let (s, l) = (rows.start[y], rows.len[y]);
        for (t, &w) in rows.weights[y * rows.ksize..y * rows.ksize + l].iter().enumerate() {
            let row = &src[((s + t) * width + c0) * 3..][..n];
            for (acc, &p) in line.iter_mut().zip(row) {
                *acc += w * p as f32;
            }
        }
        // Horizontal pass, normalised into the three planes.
        for x in 0..ow {
            let (s, l) = (cols.start[x] - c0, cols.len[x]);
            let ws = &cols.weights[x * cols.ksize..x * cols.ksize + l];
            let (mut r, mut g, mut b) = (0f32, 0f32, 0f32);
            for (t, &w) in ws.iter().enumerate() {
                let p = &line[(s + t) * 3..(s + t) * 3 + 3];
                r += w * p[0];
                g += w * p[1];
                b += w * p[2];
            }
            let ox = if flip { ow - 1 - x } else { x };
            let at = y * ow + ox;
            out[at] = r * norm.scale[0] + norm.shift[0];
            out[plane + at] = g * norm.scale[1] + norm.shift[1];
            out[2 * plane + at] = b * norm.scale[2] + norm.shift[2];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_match_pillows_coefficients_by_hand() {
        // 4 → 2: scale 2, support 2, centres 1.0 and 3.0; input pixel centres j + 0.5.
        // Output 0 reads pixels 0..3 (lo = int(1 - 2 + 0.5) = 0 after clamping, hi = 3):
        // triangle((0.5 - 1)/2) = 0.75, (1.5 - 1)/2 → 0.75, (2.5 - 1)/2 → 0.25; sum 1.75.
        let t = Taps::new(4, 0.0, 4.0, 2, 0, 2);
        assert_eq!((t.start.clone(), t.len.clone(), t.ksize), (vec![0, 1], vec![3, 3], 5));
        let w0: Vec<f32> = t.weights[..3].to_vec();
        assert!((w0[0] - 0.75 / 1.75).abs() < 1e-6 && (w0[1] - 0.75 / 1.75).abs() < 1e-6 && (w0[2] - 0.25 / 1.75).abs() < 1e-6);
        // Enlarging 2 → 4: plain bilinear, support 1: output 1 (centre 0.75) reads pixels
        // 0 and 1 with weights 0.75 and 0.25.
        let t = Taps::new(2, 0.0, 2.0, 4, 0, 4);
        assert_eq!((t.start[1], t.len[1]), (0, 2));
        assert!((t.weights[t.ksize] - 0.75).abs() < 1e-6 && (t.weights[t.ksize + 1] - 0.25).abs() < 1e-6);
        // A window of outputs has the same taps as the full resize at those positions.
        let full = Taps::new(500, 0.0, 500.0, 256, 0, 256);
        let part = Taps::new(500, 0.0, 500.0, 256, 16, 224);
        assert_eq!(part.start[..], full.start[16..240]);
        assert_eq!(part.weights[..], full.weights[16 * full.ksize..240 * full.ksize]);
    }

    #[test]
    fn a_flat_image_stays_flat_and_is_normalised() {
        let src = [100u8, 150, 200].repeat(50 * 40);
        let rows = Taps::new(40, 3.0, 37.5, 7, 0, 7);
        let cols = Taps::new(50, 0.0, 50.0, 9, 0, 9);
        let norm = Normalize::new([0.5, 0.5, 0.5], [0.25, 0.5, 1.0]);
        let mut out = vec![0f32; 3 * 7 * 9];
        resample_into(&src, 50, &rows, &cols, norm, false, &mut out);
        for (c, v) in [100.0f32, 150.0, 200.0].iter().enumerate() {
            let want = (v / 255.0 - 0.5) / [0.25, 0.5, 1.0][c];
            assert!(out[c * 63..(c + 1) * 63].iter().all(|o| (o - want).abs() < 1e-5), "channel {c}");
        }
    }

    #[test]
    fn flip_mirrors_columns_and_a_ramp_keeps_its_order() {
        // A horizontal ramp 0..255 over 64 columns, resampled to 16: increasing, and
        // the flipped output is its mirror image.
        let src: Vec<u8> = (0..8).flat_map(|_| (0..64).flat_map(|x| [(x * 4) as u8; 3])).collect();
        let rows = Taps::new(8, 0.0, 8.0, 4, 0, 4);
        let cols = Taps::new(64, 0.0, 64.0, 16, 0, 16);
        let norm = Normalize::new([0.0; 3], [1.0 / 255.0; 3]);
        let mut a = vec![0f32; 3 * 4 * 16];
        let mut b = a.clone();
        resample_into(&src, 64, &rows, &cols, norm, false, &mut a);
        resample_into(&src, 64, &rows, &cols, norm, true, &mut b);
        assert!(a[..16].windows(2).all(|w| w[1] > w[0]));
        // Output x = 5 is centred at 22 (pixel centres j + 0.5): the mean column is 21.5, value 86.
        assert!((a[5] - 86.0).abs() < 0.01, "{}", a[5]);
        for x in 0..16 {
            assert_eq!(a[x], b[15 - x]);
        }
    }
}

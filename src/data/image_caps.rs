//! What one image file may cost: its size on disk and the pixels its header declares,
//! both checked before a buffer of that size exists. A forged header (a few KB claiming
//! 30000 × 30000 pixels) or a huge file under an image's name is refused like a corrupt
//! file, in memory bounded by the caps instead of by what the file claims.

use super::idx::DataError;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;

/// Pillow's decompression-bomb limit (twice `Image.MAX_IMAGE_PIXELS`, where Pillow stops
/// warning and refuses): about 13,377 × 13,377 pixels.
pub(crate) const DEFAULT_MAX_PIXELS: u64 = 178_956_970;
/// 64 MiB.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// 65,536²: above what a JPEG header can declare (65,535 a side).
pub(crate) const MOST_PIXELS: u64 = 1 << 32;
/// 64 GiB.
pub(crate) const MOST_BYTES: u64 = 1 << 36;

/// The caps on each image file of an image folder (`train` and `loader`).
#[derive(Args, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageCaps {
    /// Refuse an image whose header declares more pixels (width × height) than this, before
    /// decoding it; it is named like a corrupt file. Decoding takes a few bytes per declared
    /// pixel (about 3 for a progressive JPEG, up to about 10 for a PNG), per worker.
    /// Default: Pillow's decompression-bomb limit, about 13,377 × 13,377.
    #[arg(long, value_name = "PIXELS", default_value_t = DEFAULT_MAX_PIXELS,
          value_parser = clap::value_parser!(u64).range(1..=MOST_PIXELS))]
    pub max_image_pixels: u64,

    /// Refuse an image file larger than this many bytes, before reading it; it is named
    /// like a corrupt file. Each worker holds one file at a time. Default: 64 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES,
          value_parser = clap::value_parser!(u64).range(1..=MOST_BYTES))]
    pub max_image_bytes: u64,
}

impl Default for ImageCaps {
    fn default() -> ImageCaps {
        ImageCaps {
            max_image_pixels: DEFAULT_MAX_PIXELS,
            max_image_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// `path` refused as an image, in the words used for a file that does not decode.
pub(crate) fn refused(path: &Path, why: &str) -> DataError {
    DataError::Invalid {
        path: path.into(),
        what: format!("cannot decode image ({why}); remove or replace the file"),
    }
}

impl ImageCaps {
    /// The file's bytes. One larger than `max_image_bytes` is refused from its size on
    /// disk, unread; at most `max_image_bytes` + 1 bytes are ever read, so a file that
    /// grows meanwhile, or one whose size the file system does not report, is refused too.
    pub(crate) fn read(&self, path: &Path) -> Result<Vec<u8>, DataError> {
        let cannot = |e: std::io::Error| DataError::Invalid {
            path: path.into(),
            what: format!("cannot read the image ({e})"),
        };
        let cap = self.max_image_bytes;
        let over = |bytes: String| {
            refused(
                path,
                &format!("the file holds {bytes} bytes, more than --max-image-bytes {cap} allows: raise --max-image-bytes to read it"),
            )
        };
        let file = std::fs::File::open(path).map_err(cannot)?;
        let len = file.metadata().map_err(cannot)?.len();
        if len > cap {
            return Err(over(len.to_string()));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(cap + 1).read_to_end(&mut bytes).map_err(cannot)?;
        if bytes.len() as u64 > cap {
            return Err(over(format!("more than {cap}")));
        }
        Ok(bytes)
    }

    /// Refuses a `width` × `height` image over `max_image_pixels` (what to say inside
    /// [`refused`]).
    pub(crate) fn check_pixels(&self, width: usize, height: usize) -> Result<(), String> {
        let pixels = (width as u128) * (height as u128);
        let cap = self.max_image_pixels;
        if pixels > cap as u128 {
            return Err(format!(
                "its header declares {width}×{height} = {pixels} pixels, more than --max-image-pixels {cap} allows: \
                 raise --max-image-pixels to decode it"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_kib(key: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_file_over_the_byte_cap_is_refused_unread() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("huge.JPEG");
        // 1 GiB of zeros without the disk space (sparse).
        std::fs::File::create(&path).unwrap().set_len(1 << 30).unwrap();
        let caps = ImageCaps {
            max_image_bytes: 1 << 20,
            ..ImageCaps::default()
        };
        // Resets the peak resident set (VmHWM) to what is resident now.
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kib("VmRSS");
        let e = caps.read(&path).unwrap_err().to_string();
        let grown_kib = status_kib("VmHWM").saturating_sub(before);
        assert!(grown_kib < 16 << 10, "the peak resident set grew by {grown_kib} KiB");
        assert!(
            e.contains("huge.JPEG: cannot decode image (the file holds 1073741824 bytes, more than --max-image-bytes 1048576"),
            "{e}"
        );
        // At the cap exactly: read whole.
        std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
        assert_eq!(caps.read(&path).unwrap().len(), 1 << 20);
        let e = caps.read(&d.path().join("absent.jpg")).unwrap_err().to_string();
        assert!(e.contains("absent.jpg: cannot read the image"), "{e}");
    }

    #[test]
    fn pixels_are_counted_without_overflow() {
        let caps = ImageCaps {
            max_image_pixels: 1000,
            ..ImageCaps::default()
        };
        assert!(caps.check_pixels(40, 25).is_ok());
        let e = caps.check_pixels(64, 64).unwrap_err();
        assert!(e.contains("64×64 = 4096 pixels, more than --max-image-pixels 1000"), "{e}");
        assert!(caps.check_pixels(usize::MAX, usize::MAX).is_err());
        assert!(ImageCaps::default().check_pixels(13_377, 13_377).is_ok());
        assert!(ImageCaps::default().check_pixels(30_000, 30_000).is_err());
    }
}

//! Dates in UTC as text, without a date crate: `YYYY-MM-DD` ([`today`], the bundles'
//! `{date}`) and RFC 3339 with milliseconds ([`rfc3339`], decision records), both from one
//! civil-date conversion (Howard Hinnant's algorithm).
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//!
//! let t = UNIX_EPOCH + Duration::from_millis(1_795_698_300_250);
//! assert_eq!(engine::date::rfc3339(t), "2026-11-26T13:05:00.250Z");
//! assert_eq!(engine::date::date_of_day(19_782), "2024-02-29");
//! ```

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// The civil date `(year, month, day)` of `days` since 1970-01-01.
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `days` since 1970-01-01 as `YYYY-MM-DD`.
pub fn date_of_day(days: i64) -> String {
    let (year, month, day) = civil(days);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    date_of_day(i64::try_from(secs / 86_400).unwrap_or(0))
}

/// `time` as RFC 3339 in UTC with milliseconds (`2026-11-26T13:05:00.250Z`).
pub fn rfc3339(time: SystemTime) -> String {
    let ms = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil(days);
    // Digit by digit into one allocation of the final size: a router stamps every decision.
    let mut text = String::with_capacity(24);
    if (0..=9_999).contains(&year) {
        digits(&mut text, year, 4);
    } else {
        let _ = write!(text, "{year:04}");
    }
    for (separator, value, width) in [
        ('-', month, 2),
        ('-', day, 2),
        ('T', rem / 3_600, 2),
        (':', rem % 3_600 / 60, 2),
        (':', rem % 60, 2),
        ('.', (ms % 1000) as i64, 3),
    ] {
        text.push(separator);
        digits(&mut text, value, width);
    }
    text.push('Z');
    text
}

/// `value` (0 ≤ value < 10^`width`) as exactly `width` decimal digits.
fn digits(text: &mut String, value: i64, width: u32) {
    for place in (0..width).rev() {
        let digit = value / 10_i64.pow(place) % 10;
        text.push(char::from(b'0' + digit as u8));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(date_of_day(0), "1970-01-01");
        assert_eq!(date_of_day(19_782), "2024-02-29");
        assert_eq!(date_of_day(20_418), "2025-11-26");
        assert_eq!(today().len(), 10);
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_698_300_250);
        assert_eq!(rfc3339(t), "2026-11-26T13:05:00.250Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}

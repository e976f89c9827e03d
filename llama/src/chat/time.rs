//! `strftime_now(format)`, the date helper that chat templates call (Llama 3.x writes
//! `Today Date: {{ strftime_now("%d %b %Y") }}`), formatting the current UTC time with the common
//! C `strftime` directives and no time-zone database.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DateTime {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Sunday
    weekday: u32,
    /// 1..=366
    yday: u32,
}

impl DateTime {
    /// The UTC time `secs` seconds after the Unix epoch.
    pub(crate) fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let jan1 = days_from_civil(year, 1, 1);
        DateTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            weekday: (days + 4).rem_euclid(7) as u32,
            yday: (days - jan1 + 1) as u32,
        }
    }

    /// Now, in UTC.
    pub(crate) fn now() -> DateTime {
        let secs = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        DateTime::from_unix(secs)
    }

    /// Formats like C's `strftime`; unknown directives are copied as they are (as glibc does).
    pub(crate) fn format(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let hour12 = (self.hour + 11) % 12 + 1;
            let month = MONTHS[self.month as usize - 1];
            let weekday = DAYS[self.weekday as usize];
            let text = match d {
                'Y' => self.year.to_string(),
                'y' => format!("{:02}", self.year.rem_euclid(100)),
                'C' => format!("{:02}", self.year.div_euclid(100)),
                'm' => format!("{:02}", self.month),
                'd' => format!("{:02}", self.day),
                'e' => format!("{:2}", self.day),
                'j' => format!("{:03}", self.yday),
                'H' => format!("{:02}", self.hour),
                'I' => format!("{hour12:02}"),
                'M' => format!("{:02}", self.minute),
                'S' => format!("{:02}", self.second),
                'p' => (if self.hour < 12 { "AM" } else { "PM" }).to_string(),
                'B' => month.to_string(),
                'b' | 'h' => month[..3].to_string(),
                'A' => weekday.to_string(),
                'a' => weekday[..3].to_string(),
                'w' => self.weekday.to_string(),
                'u' => ((self.weekday + 6) % 7 + 1).to_string(),
                'F' => self.format("%Y-%m-%d"),
                'D' => self.format("%m/%d/%y"),
                'T' => self.format("%H:%M:%S"),
                'R' => self.format("%H:%M"),
                'c' => self.format("%a %b %e %H:%M:%S %Y"),
                'x' => self.format("%m/%d/%y"),
                'X' => self.format("%H:%M:%S"),
                'Z' => "UTC".to_string(),
                'z' => "+0000".to_string(),
                'n' => "\n".to_string(),
                't' => "\t".to_string(),
                '%' => "%".to_string(),
                other => format!("%{other}"),
            };
            out.push_str(&text);
        }
        out
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01, the inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = DateTime::from_unix(1_709_211_909);
        assert_eq!(
            t.format("%d %b %Y|%B %A %a|%H:%M:%S %I%p|%j %y %m %e|%%|%Q"),
            "29 Feb 2024|February Thursday Thu|13:05:09 01PM|060 24 02 29|%|%Q"
        );
        assert_eq!(
            DateTime::from_unix(0).format("%F %T %a"),
            "1970-01-01 00:00:00 Thu"
        );
        assert_eq!(
            DateTime::from_unix(-1).format("%F %T"),
            "1969-12-31 23:59:59"
        );
        for days in [-800_000i64, -1, 0, 59, 10_000, 20_000, 3_000_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}

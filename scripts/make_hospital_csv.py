"""Write a small synthetic hospital table (``docs/examples/hospital.csv``) for docs/your-data.md.

Four sites of different sizes and case mixes; one row per admission: ``site``, ``age``,
``sex``, ``bmi``, ``systolic_bp``, ``glucose``, ``smoker``, ``ward`` and the label
``readmitted`` (1 = readmitted within 30 days, about 1 in 5).  The risk is a logistic function
of the features plus a per-site offset, so the sites differ as real hospitals do.  Seeded:
the same file every time.

    python scripts/make_hospital_csv.py                 # writes docs/examples/hospital.csv
    python scripts/make_hospital_csv.py out.csv --rows 2000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

SITES = {"north": 0.40, "south": 0.25, "east": 0.20, "west": 0.15}  # share of the rows
SITE_OFFSET = {"north": -0.3, "south": 0.0, "east": 0.4, "west": 0.8}
SITE_AGE = {"north": 55.0, "south": 62.0, "east": 66.0, "west": 70.0}
WARDS = ["cardiology", "general", "respiratory"]


def make(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    site = rng.choice(list(SITES), size=rows, p=list(SITES.values()))
    age = np.clip(rng.normal([SITE_AGE[s] for s in site], 12.0), 18, 99).round()
    sex = rng.choice(["F", "M"], size=rows)
    bmi = np.clip(rng.normal(27.0, 4.5, rows), 15, 50).round(1)
    sbp = np.clip(rng.normal(128 + 0.3 * (age - 60), 15.0), 85, 220).round()
    glucose = np.clip(rng.lognormal(np.log(5.6), 0.25, rows), 3, 25).round(1)
    smoker = rng.choice(["no", "yes"], size=rows, p=[0.75, 0.25])
    ward = rng.choice(WARDS, size=rows, p=[0.3, 0.5, 0.2])
    logit = (
        -2.0
        + 0.04 * (age - 60)
        + 0.05 * (bmi - 27)
        + 0.02 * (sbp - 130)
        + 0.35 * (glucose - 5.6)
        + 0.6 * (smoker == "yes")
        + 0.5 * (ward == "cardiology")
        + np.array([SITE_OFFSET[s] for s in site])
    )
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    return pd.DataFrame(
        {
            "site": site,
            "age": age.astype(int),
            "sex": sex,
            "bmi": bmi,
            "systolic_bp": sbp.astype(int),
            "glucose": glucose,
            "smoker": smoker,
            "ward": ward,
            "readmitted": label,
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="docs/examples/hospital.csv")
    ap.add_argument("--rows", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    df = make(args.rows, args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    by_site = df.groupby("site")["readmitted"].agg(["size", "mean"]).round(3)
    print(f"wrote {args.out}: {len(df)} rows, {df['readmitted'].mean():.3f} readmitted\n{by_site}")


if __name__ == "__main__":
    main()

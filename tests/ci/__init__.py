"""The GitHub workflows: linted with actionlint, and doing what they promise."""

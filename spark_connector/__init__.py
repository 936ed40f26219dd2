"""PySpark data source ``ketten``: read replicated chains as DataFrames."""

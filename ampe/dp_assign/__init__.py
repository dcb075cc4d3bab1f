"""ampe.dp_assign"""

"""ampe.search"""
